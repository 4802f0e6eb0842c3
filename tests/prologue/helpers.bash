# Shared by the prologue suites. The shell under test comes from SHELL_NAME,
bats_require_minimum_version 1.5.0
# set by run-shells.sh; an unknown or missing shell fails every test.
load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

REPO=$(cd "$BATS_TEST_DIRNAME/../.." && pwd)
PROLOGUE=$(cat "$REPO/prologue/prologue.sh")

# The argv that starts the shell under test as sh.
shell_argv() {
  case $SHELL_NAME in
    dash) SH=(/usr/bin/dash) ;;
    bash) SH=(/usr/bin/bash) ;;
    bash-posix) SH=(/usr/bin/bash --posix) ;;
    busybox) SH=(/usr/bin/busybox sh) ;;
    posh) SH=(/usr/bin/posh) ;;
    mksh) SH=(/usr/bin/mksh) ;;
    yash) SH=(/usr/bin/yash) ;;
    ksh93) SH=(/usr/bin/ksh93) ;;
    # zsh emulates sh when it is started under the name sh.
    zsh) SH=("$ZSH_AS_SH") ;;
    *) echo "unknown SHELL_NAME '$SHELL_NAME'" >&2; return 1 ;;
  esac
  [[ -x ${SH[0]} ]] || { echo "missing shell ${SH[0]}" >&2; return 1; }
}

common_setup() {
  shell_argv
  BASE_ENV=(PATH=/usr/bin:/bin LC_ALL=C.UTF-8 HOME="$BATS_TEST_TMPDIR")
  OK_ENV=(DISPATCH_K8S_ADMISSION=3 DISPATCH_K8S_RESTART=2
    DISPATCH_K8S_EPOCH_PREFIX=1000002 DISPATCH_K8S_TOKEN_PREFIX=job-7.2.1)
  cd "$BATS_TEST_TMPDIR"
}

# prologue VAR=VALUE... -- CMD ARG...: runs the prologue in the shell under
# test with exactly the base environment plus the given variables.
prologue() {
  local vars=()
  while [[ $# -gt 0 && $1 != -- ]]; do vars+=("$1"); shift; done
  [[ ${1-} == -- ]] && shift
  env -i "${BASE_ENV[@]}" "${vars[@]}" "${SH[@]}" -c "$PROLOGUE" dispatch-prologue "$@"
}

# The command most tests run: prints what it saw.
SHOW=(/bin/sh -c 'echo "$DISPATCH_EPOCH $DISPATCH_ATTEMPT"')

# refused [VAR=VALUE...]: the prologue exits 125 with one "dispatch: " line on
# stderr, nothing on stdout, and the command did not run.
refused() {
  run -125 --separate-stderr prologue "$@" -- /usr/bin/touch "$BATS_TEST_TMPDIR/ran"
  assert_output ''
  [[ $stderr == dispatch:\ * ]] || fail "stderr is not a dispatch: line: $stderr"
  [[ $stderr != *$'\n'* ]] || fail "stderr has more than one line: $stderr"
  [[ ! -e $BATS_TEST_TMPDIR/ran ]] || fail "the command ran"
}

# refused_cmd CMD: the prologue, with valid inputs, refuses to run CMD.
refused_cmd() {
  run -125 --separate-stderr prologue "${OK_ENV[@]}" -- "$@"
  assert_output ''
  [[ $stderr == dispatch:\ * && $stderr != *$'\n'* ]] || fail "stderr is not one dispatch: line: $stderr"
}

# sees VAR=VALUE... -- EXPECTED: the command saw exactly EXPECTED
sees() {
  local vars=()
  while [[ $1 != -- ]]; do vars+=("$1"); shift; done
  shift
  run -0 --separate-stderr prologue "${vars[@]}" -- "${SHOW[@]}"
  assert_output "$1"
  assert_equal "$stderr" ''
}
