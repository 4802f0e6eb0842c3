#!/usr/bin/env bats
# The prologue forks nothing and runs no external program: between the
# shell's start and the exec of the command, strace sees no clone, fork or
# vfork, and exactly two execve calls (the shell, then the command).

setup() {
  load helpers
  common_setup
}

@test "${SHELL_NAME}: the shell under test splits words as a POSIX sh" {
  # Word splitting of an unquoted expansion is sh behaviour; native zsh
  # does not split, so this shows zsh really is in sh emulation.
  run -0 env -i "${BASE_ENV[@]}" "${SH[@]}" -c 'x="a b"; set -- $x; echo $#'
  assert_output 2
}

@test "${SHELL_NAME}: the shell under test is the binary its name says" {
  run -0 env -i "${BASE_ENV[@]}" "${SH[@]}" -c '/usr/bin/readlink /proc/$$/exe; exit $?'
  case $SHELL_NAME in
    bash-posix) assert_output /usr/bin/bash
      run -0 env -i "${BASE_ENV[@]}" "${SH[@]}" -c 'case :$SHELLOPTS: in *:posix:*) echo posix ;; esac'
      assert_output posix ;;
    busybox) assert_output /usr/bin/busybox ;;
    zsh) assert_output /usr/bin/zsh
      # sh emulation turns on octal zeroes; native zsh reads 010 as 10.
      run -0 env -i "${BASE_ENV[@]}" "${SH[@]}" -c 'echo $((010))'
      assert_output 8 ;;
    *) assert_output "/usr/bin/$SHELL_NAME" ;;
  esac
}

# forks_nothing VAR=VALUE...: under strace, the prologue with these inputs
# makes no clone, fork or vfork, and execs exactly env, the shell, then
# /bin/true.
forks_nothing() {
  local log=$BATS_TEST_TMPDIR/strace
  run -0 strace -f -qq -o "$log" -e trace=process,execve \
    env -i "${BASE_ENV[@]}" "$@" "${SH[@]}" -c "$PROLOGUE" dispatch-prologue /bin/true
  if grep -E '(^|[ ])(clone|clone3|fork|vfork)\(' "$log"; then
    fail "the prologue forked"
  fi
  run grep -c 'execve(' "$log"
  assert_output 3
  run grep 'execve(' "$log"
  assert_line --index 2 --partial 'execve("/bin/true"'
}

@test "${SHELL_NAME}: forks nothing between the shell's start and the exec of the command" {
  forks_nothing "${OK_ENV[@]}"
}

@test "${SHELL_NAME}: forks nothing on the longest path: a 13-digit prefix at the int64 edge and a workdir" {
  mkdir -p "$BATS_TEST_TMPDIR/w"
  forks_nothing DISPATCH_K8S_ADMISSION=775806 DISPATCH_K8S_RESTART=1 DISPATCH_K8S_EPOCH_PREFIX=9223372036854 \
    DISPATCH_K8S_TOKEN_PREFIX=t.1.0 "DISPATCH_K8S_WORKDIR=$BATS_TEST_TMPDIR/w" "CDPATH=/"
}

@test "${SHELL_NAME}: refusing forks nothing and runs nothing" {
  local log=$BATS_TEST_TMPDIR/strace
  run -125 strace -f -qq -o "$log" -e trace=process,execve \
    env -i "${BASE_ENV[@]}" DISPATCH_K8S_ADMISSION=01 DISPATCH_K8S_RESTART=0 DISPATCH_K8S_TOKEN_PREFIX=t \
    "${SH[@]}" -c "$PROLOGUE" dispatch-prologue /bin/true
  run grep -cE '(clone|clone3|fork|vfork)\(' "$log"
  assert_output 0
  run grep -c 'execve(' "$log"
  assert_output 2
}

@test "${SHELL_NAME}: refusing an int64 overflow or a workdir forks nothing and runs nothing" {
  local log=$BATS_TEST_TMPDIR/strace
  run -125 strace -f -qq -o "$log" -e trace=process,execve \
    env -i "${BASE_ENV[@]}" DISPATCH_K8S_ADMISSION=775808 DISPATCH_K8S_RESTART=0 \
    DISPATCH_K8S_EPOCH_PREFIX=9223372036854 DISPATCH_K8S_TOKEN_PREFIX=t \
    "${SH[@]}" -c "$PROLOGUE" dispatch-prologue /bin/true
  run grep -cE '(clone|clone3|fork|vfork)\(' "$log"
  assert_output 0
  run -125 strace -f -qq -o "$log" -e trace=process,execve \
    env -i "${BASE_ENV[@]}" "${OK_ENV[@]}" DISPATCH_K8S_WORKDIR=/nonexistent \
    "${SH[@]}" -c "$PROLOGUE" dispatch-prologue /bin/true
  run grep -cE '(clone|clone3|fork|vfork)\(' "$log"
  assert_output 0
  run grep -c 'execve(' "$log"
  assert_output 2
}
