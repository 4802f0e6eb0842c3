#!/usr/bin/env bats
# The prologue contract (docs/prologue.md), clause by clause, in the shell named
# by SHELL_NAME. run-shells.sh runs this file once per shell.

setup() {
  load helpers
  common_setup
}

# --- valid values -----------------------------------------------------------

@test "${SHELL_NAME}: builds the epoch and attempt from A, J and the prefixes" {
  sees "${OK_ENV[@]}" -- "1000002000005 job-7.2.1.3.2"
}

@test "${SHELL_NAME}: an empty epoch prefix gives R itself, without leading zeros" {
  sees DISPATCH_K8S_ADMISSION=1 DISPATCH_K8S_RESTART=0 DISPATCH_K8S_EPOCH_PREFIX= \
    DISPATCH_K8S_TOKEN_PREFIX=j.0.0 -- "1 j.0.0.1.0"
}

@test "${SHELL_NAME}: refuses an unset epoch prefix: the packager always sets it, empty for G = N = 0" {
  refused DISPATCH_K8S_ADMISSION=12 DISPATCH_K8S_RESTART=30 DISPATCH_K8S_TOKEN_PREFIX=j.0.0
  assert_equal "$stderr" "dispatch: DISPATCH_K8S_EPOCH_PREFIX is not set (the packager sets it, to empty when G and N are 0)"
}

@test "${SHELL_NAME}: pads R to six digits after a prefix, for every length of R" {
  local a want
  for a in 1 12 123 1234 12345 123456; do
    want=$(printf '7%06d j.1.0.%s.0' "$a" "$a")
    sees DISPATCH_K8S_ADMISSION=$a DISPATCH_K8S_RESTART=0 DISPATCH_K8S_EPOCH_PREFIX=7 \
      DISPATCH_K8S_TOKEN_PREFIX=j.1.0 -- "$want"
  done
}

@test "${SHELL_NAME}: accepts A and J at 999999 and R one below the bound" {
  sees DISPATCH_K8S_ADMISSION=999999 DISPATCH_K8S_RESTART=0 DISPATCH_K8S_EPOCH_PREFIX= DISPATCH_K8S_TOKEN_PREFIX=t -- "999999 t.999999.0"
  sees DISPATCH_K8S_ADMISSION=1 DISPATCH_K8S_RESTART=999998 DISPATCH_K8S_EPOCH_PREFIX= DISPATCH_K8S_TOKEN_PREFIX=t -- "999999 t.1.999998"
}

@test "${SHELL_NAME}: accepts a 13-digit prefix" {
  sees DISPATCH_K8S_ADMISSION=5 DISPATCH_K8S_RESTART=0 DISPATCH_K8S_EPOCH_PREFIX=1234567000001 \
    DISPATCH_K8S_TOKEN_PREFIX=t -- "1234567000001000005 t.5.0"
}

@test "${SHELL_NAME}: accepts the largest epoch that fits a signed 64-bit integer" {
  sees DISPATCH_K8S_ADMISSION=775807 DISPATCH_K8S_RESTART=0 DISPATCH_K8S_EPOCH_PREFIX=9223372036854 \
    DISPATCH_K8S_TOKEN_PREFIX=t -- "9223372036854775807 t.775807.0"
  sees DISPATCH_K8S_ADMISSION=999999 DISPATCH_K8S_RESTART=0 DISPATCH_K8S_EPOCH_PREFIX=9223372036853 \
    DISPATCH_K8S_TOKEN_PREFIX=t -- "9223372036853999999 t.999999.0"
  sees DISPATCH_K8S_ADMISSION=999999 DISPATCH_K8S_RESTART=0 DISPATCH_K8S_EPOCH_PREFIX=9223371999999 \
    DISPATCH_K8S_TOKEN_PREFIX=t -- "9223371999999999999 t.999999.0"
  # R = 775807 made of A and J; N with leading zeros inside the prefix.
  sees DISPATCH_K8S_ADMISSION=775806 DISPATCH_K8S_RESTART=1 DISPATCH_K8S_EPOCH_PREFIX=9223372036854 \
    DISPATCH_K8S_TOKEN_PREFIX=t -- "9223372036854775807 t.775806.1"
  sees DISPATCH_K8S_ADMISSION=999999 DISPATCH_K8S_RESTART=0 DISPATCH_K8S_EPOCH_PREFIX=9223372000000 \
    DISPATCH_K8S_TOKEN_PREFIX=t -- "9223372000000999999 t.999999.0"
  sees DISPATCH_K8S_ADMISSION=1 DISPATCH_K8S_RESTART=0 DISPATCH_K8S_EPOCH_PREFIX=9223372000099 \
    DISPATCH_K8S_TOKEN_PREFIX=t -- "9223372000099000001 t.1.0"
}

@test "${SHELL_NAME}: accepts a 12-digit prefix with any R" {
  sees DISPATCH_K8S_ADMISSION=999998 DISPATCH_K8S_RESTART=1 DISPATCH_K8S_EPOCH_PREFIX=999999999999 \
    DISPATCH_K8S_TOKEN_PREFIX=t -- "999999999999999999 t.999998.1"
}

@test "${SHELL_NAME}: a token prefix may hold dots" {
  sees DISPATCH_K8S_ADMISSION=2 DISPATCH_K8S_RESTART=1 DISPATCH_K8S_EPOCH_PREFIX= DISPATCH_K8S_TOKEN_PREFIX=a.b.c.4.0 -- "3 a.b.c.4.0.2.1"
}

# --- refusals: A and J -------------------------------------------------------

@test "${SHELL_NAME}: refuses A = 0, which was never admitted" {
  refused DISPATCH_K8S_ADMISSION=0 DISPATCH_K8S_RESTART=5 DISPATCH_K8S_EPOCH_PREFIX= DISPATCH_K8S_TOKEN_PREFIX=t
  assert_equal "$stderr" "dispatch: DISPATCH_K8S_ADMISSION is 0: this execution was not admitted through dispatch"
}

@test "${SHELL_NAME}: refuses R at the bound 1000000" {
  refused DISPATCH_K8S_ADMISSION=999999 DISPATCH_K8S_RESTART=1 DISPATCH_K8S_EPOCH_PREFIX= DISPATCH_K8S_TOKEN_PREFIX=t
  assert_equal "$stderr" "dispatch: R = A + J = 1000000 reached the bound 1000000"
  refused DISPATCH_K8S_ADMISSION=999999 DISPATCH_K8S_RESTART=999999 DISPATCH_K8S_EPOCH_PREFIX= DISPATCH_K8S_TOKEN_PREFIX=t
}

@test "${SHELL_NAME}: J = 999999 is a valid count, refused only by the bound on R" {
  refused DISPATCH_K8S_ADMISSION=1 DISPATCH_K8S_RESTART=999999 DISPATCH_K8S_EPOCH_PREFIX= DISPATCH_K8S_TOKEN_PREFIX=t
  assert_equal "$stderr" "dispatch: R = A + J = 1000000 reached the bound 1000000"
}

@test "${SHELL_NAME}: refuses 1000000 as A or J, one past six digits" {
  refused DISPATCH_K8S_ADMISSION=1000000 DISPATCH_K8S_RESTART=0 DISPATCH_K8S_EPOCH_PREFIX= DISPATCH_K8S_TOKEN_PREFIX=t
  assert_equal "$stderr" "dispatch: DISPATCH_K8S_ADMISSION is not 0 or a decimal of at most 6 digits without a leading zero"
  refused DISPATCH_K8S_ADMISSION=1 DISPATCH_K8S_RESTART=1000000 DISPATCH_K8S_EPOCH_PREFIX= DISPATCH_K8S_TOKEN_PREFIX=t
  assert_equal "$stderr" "dispatch: DISPATCH_K8S_RESTART is not 0 or a decimal of at most 6 digits without a leading zero"
}

@test "${SHELL_NAME}: refuses an unset A and an unset J" {
  refused DISPATCH_K8S_RESTART=1 DISPATCH_K8S_EPOCH_PREFIX= DISPATCH_K8S_TOKEN_PREFIX=t
  assert_equal "$stderr" "dispatch: DISPATCH_K8S_ADMISSION is empty or not set"
  refused DISPATCH_K8S_ADMISSION=1 DISPATCH_K8S_EPOCH_PREFIX= DISPATCH_K8S_TOKEN_PREFIX=t
  assert_equal "$stderr" "dispatch: DISPATCH_K8S_RESTART is empty or not set"
}

BAD_COUNTS=('' '+1' '-1' ' 1' '1 ' '1 2' '01' '010' '08' '00' '0x1' '0X1F' '1e3' '1.0'
  '1000000' '9999999' '99999999999999999999' '9223372036854775807' 'a' '1a'
  $'1\n' $'\n1' $'1\t' '١' '１' '1*' '?' '[1]' '$((1))' '`true`' '$(true)'
  '-n' '\c' '%s' $'\xff' $'1\xff' $'\e[31m1')

@test "${SHELL_NAME}: refuses every class of bad A (empty, sign, space, leading zero, hex, exponent, 7+ digits, huge, non-ASCII)" {
  local v
  for v in "${BAD_COUNTS[@]}"; do
    refused "DISPATCH_K8S_ADMISSION=$v" DISPATCH_K8S_RESTART=1 DISPATCH_K8S_EPOCH_PREFIX= DISPATCH_K8S_TOKEN_PREFIX=t
    [[ $stderr == "dispatch: DISPATCH_K8S_ADMISSION "* ]] || fail "A=[$v]: $stderr"
  done
}

@test "${SHELL_NAME}: refuses every class of bad J" {
  local v
  for v in "${BAD_COUNTS[@]}"; do
    refused DISPATCH_K8S_ADMISSION=1 "DISPATCH_K8S_RESTART=$v" DISPATCH_K8S_EPOCH_PREFIX= DISPATCH_K8S_TOKEN_PREFIX=t
    [[ $stderr == "dispatch: DISPATCH_K8S_RESTART "* ]] || fail "J=[$v]: $stderr"
  done
}

@test "${SHELL_NAME}: a leading zero is refused, never read as octal or decimal" {
  refused DISPATCH_K8S_ADMISSION=010 DISPATCH_K8S_RESTART=0 DISPATCH_K8S_EPOCH_PREFIX= DISPATCH_K8S_TOKEN_PREFIX=t
  assert_equal "$stderr" "dispatch: DISPATCH_K8S_ADMISSION is not 0 or a decimal of at most 6 digits without a leading zero"
}

# --- refusals: prefixes ------------------------------------------------------

@test "${SHELL_NAME}: refuses a bad epoch prefix (zero, leading zero, 14 digits, sign, letters)" {
  local v
  for v in 0 00 01 00000000000001 12345678901234 99999999999999999999 -1 +1 ' 1' 1a x 0x1 1e3 \
    $'1\n' '1 ' '*' '١' $'\xff' '-n' '\c'; do
    refused DISPATCH_K8S_ADMISSION=1 DISPATCH_K8S_RESTART=0 "DISPATCH_K8S_EPOCH_PREFIX=$v" DISPATCH_K8S_TOKEN_PREFIX=t
    [[ $stderr == "dispatch: DISPATCH_K8S_EPOCH_PREFIX "* ]] || fail "prefix=[$v]: $stderr"
  done
}

@test "${SHELL_NAME}: refuses an epoch past the signed 64-bit bound" {
  refused DISPATCH_K8S_ADMISSION=775808 DISPATCH_K8S_RESTART=0 DISPATCH_K8S_EPOCH_PREFIX=9223372036854 DISPATCH_K8S_TOKEN_PREFIX=t
  assert_equal "$stderr" "dispatch: epoch 9223372036854775808 does not fit a signed 64-bit integer"
  refused DISPATCH_K8S_ADMISSION=775807 DISPATCH_K8S_RESTART=1 DISPATCH_K8S_EPOCH_PREFIX=9223372036854 DISPATCH_K8S_TOKEN_PREFIX=t
  assert_equal "$stderr" "dispatch: epoch 9223372036854775808 does not fit a signed 64-bit integer"
  refused DISPATCH_K8S_ADMISSION=999999 DISPATCH_K8S_RESTART=0 DISPATCH_K8S_EPOCH_PREFIX=9223372036854 DISPATCH_K8S_TOKEN_PREFIX=t
  refused DISPATCH_K8S_ADMISSION=1 DISPATCH_K8S_RESTART=0 DISPATCH_K8S_EPOCH_PREFIX=9223372036855 DISPATCH_K8S_TOKEN_PREFIX=t
  refused DISPATCH_K8S_ADMISSION=1 DISPATCH_K8S_RESTART=0 DISPATCH_K8S_EPOCH_PREFIX=9223373000000 DISPATCH_K8S_TOKEN_PREFIX=t
  refused DISPATCH_K8S_ADMISSION=1 DISPATCH_K8S_RESTART=0 DISPATCH_K8S_EPOCH_PREFIX=9999999999999 DISPATCH_K8S_TOKEN_PREFIX=t
}

@test "${SHELL_NAME}: the token prefix is used verbatim, any visible ASCII" {
  local t
  for t in 'a.b.c.1.0' '-n' '$HOME' '\c' '*' "!\"#\$%&'()*+,-./:;<=>?@[\\]^_\`{|}~" 'AZaz09'; do
    run -0 --separate-stderr prologue DISPATCH_K8S_ADMISSION=1 DISPATCH_K8S_RESTART=0 DISPATCH_K8S_EPOCH_PREFIX= \
      "DISPATCH_K8S_TOKEN_PREFIX=$t" -- /usr/bin/printenv DISPATCH_ATTEMPT
    assert_output "$t.1.0"
  done
}

@test "${SHELL_NAME}: refuses a token prefix with a space, a control or a non-ASCII character" {
  local t
  for t in 'a b' $'a\tb' $'a\nb' $'a\x7f' 'é' '١' $'job\x01'; do
    refused DISPATCH_K8S_ADMISSION=1 DISPATCH_K8S_RESTART=0 DISPATCH_K8S_EPOCH_PREFIX= "DISPATCH_K8S_TOKEN_PREFIX=$t"
    assert_equal "$stderr" "dispatch: DISPATCH_K8S_TOKEN_PREFIX holds a character that is not visible ASCII"
  done
  # Not UTF-8: yash does not import such a variable, so to yash it is unset.
  refused DISPATCH_K8S_ADMISSION=1 DISPATCH_K8S_RESTART=0 DISPATCH_K8S_EPOCH_PREFIX= $'DISPATCH_K8S_TOKEN_PREFIX=job\xff'
  if [[ $SHELL_NAME == yash ]]; then
    assert_equal "$stderr" "dispatch: DISPATCH_K8S_TOKEN_PREFIX is empty or not set"
  else
    assert_equal "$stderr" "dispatch: DISPATCH_K8S_TOKEN_PREFIX holds a character that is not visible ASCII"
  fi
}

@test "${SHELL_NAME}: refuses an empty or unset token prefix" {
  refused DISPATCH_K8S_ADMISSION=1 DISPATCH_K8S_RESTART=0 DISPATCH_K8S_EPOCH_PREFIX= DISPATCH_K8S_TOKEN_PREFIX=
  assert_equal "$stderr" "dispatch: DISPATCH_K8S_TOKEN_PREFIX is empty or not set"
  refused DISPATCH_K8S_ADMISSION=1 DISPATCH_K8S_RESTART=0 DISPATCH_K8S_EPOCH_PREFIX=
}

# --- the command -------------------------------------------------------------

@test "${SHELL_NAME}: refuses to run without a command" {
  run -125 --separate-stderr prologue "${OK_ENV[@]}"
  assert_output ''
  assert_equal "$stderr" "dispatch: no command to run"
}

@test "${SHELL_NAME}: refuses an empty command name" {
  run -125 --separate-stderr prologue "${OK_ENV[@]}" -- '' arg
  assert_equal "$stderr" "dispatch: no command to run"
}

@test "${SHELL_NAME}: passes arguments with spaces, quotes, globs and newlines intact" {
  run -0 --separate-stderr prologue "${OK_ENV[@]}" -- /usr/bin/printf '[%s]\n' \
    'a b' '"q"' "'s'" '*' '$HOME' $'x\ny' '' '-n' '\t' '  lead'
  assert_output "$(printf '[%s]\n' 'a b' '"q"' "'s'" '*' '$HOME' $'x\ny' '' '-n' '\t' '  lead')"
}

@test "${SHELL_NAME}: passes the command's exit status through" {
  local s
  for s in 0 1 42 124 125 255; do
    run -"$s" prologue "${OK_ENV[@]}" -- /bin/sh -c "exit $s"
  done
}

@test "${SHELL_NAME}: a command that cannot be found exits 127 from the shell" {
  run -127 prologue "${OK_ENV[@]}" -- /nonexistent/cmd
  run -127 prologue "${OK_ENV[@]}" -- no-such-command-on-path
}

@test "${SHELL_NAME}: a command that cannot be executed exits 126 from the shell" {
  touch "$BATS_TEST_TMPDIR/plain"
  chmod 644 "$BATS_TEST_TMPDIR/plain"
  run -126 prologue "${OK_ENV[@]}" -- "$BATS_TEST_TMPDIR/plain"
  run -126 prologue "${OK_ENV[@]}" -- "$BATS_TEST_TMPDIR"
}

@test "${SHELL_NAME}: refuses a command name that exec would read as its option" {
  local c
  for c in -c -x -- -; do
    refused_cmd "$c"
    assert_equal "$stderr" "dispatch: the command name starts with -, which exec would read as an option"
  done
}

@test "${SHELL_NAME}: a command named with a glob or an equals sign is looked up as named" {
  mkdir -p "$BATS_TEST_TMPDIR/bin"
  local c
  for c in 'x*' 'A=1' '?'; do
    printf '#!/bin/sh\necho "ran $0"\n' >"$BATS_TEST_TMPDIR/bin/$c"
    chmod +x "$BATS_TEST_TMPDIR/bin/$c"
    run -0 --separate-stderr env -i "PATH=$BATS_TEST_TMPDIR/bin:/usr/bin:/bin" "${BASE_ENV[@]:1}" "${OK_ENV[@]}" \
      "${SH[@]}" -c "$PROLOGUE" dispatch-prologue "$c"
    assert_output "ran $BATS_TEST_TMPDIR/bin/$c"
  done
}

@test "${SHELL_NAME}: the command keeps the shell's PID (exec, not a child)" {
  env -i "${BASE_ENV[@]}" "${OK_ENV[@]}" "${SH[@]}" -c "$PROLOGUE" dispatch-prologue \
    /bin/sh -c 'echo $$' >"$BATS_TEST_TMPDIR/pid" &
  local pid=$!
  wait "$pid"
  assert_equal "$(cat "$BATS_TEST_TMPDIR/pid")" "$pid"
}

# --- the environment ---------------------------------------------------------

@test "${SHELL_NAME}: the command sees DISPATCH_EPOCH and DISPATCH_ATTEMPT, no DISPATCH_K8S_*, and the rest untouched" {
  local user=(R=keep E=also 'SPACED=a b' 'NL=x
y' DISPATCH_EPOCH=stale DISPATCH_ATTEMPT=stale 'UTF=é١' $'BYTES=\xff\xfe\x01' 'EQ=a=b' 'EMPTY='
    'GLOB=*' 'IFS=0123456789' DISPATCH_K8S_R=stale)
  # The same shell's own exports (PWD, SHLVL, ...) are the baseline.
  local base
  base=$(env -i "${BASE_ENV[@]}" "${user[@]}" "${SH[@]}" -c 'exec "$@"' x /usr/bin/env -0 |
    tr '\0\n' '\n\1' | grep -a -v -e '^_=' -e '^DISPATCH_EPOCH=' -e '^DISPATCH_ATTEMPT=' -e '^DISPATCH_K8S_' | sort)
  prologue "${OK_ENV[@]}" DISPATCH_K8S_WORKDIR= "${user[@]}" -- /usr/bin/env -0 >"$BATS_TEST_TMPDIR/env"
  local got
  got=$(tr '\0\n' '\n\1' <"$BATS_TEST_TMPDIR/env" | grep -a -v '^_=' | sort)
  local want
  want=$(printf '%s\n' "$base" DISPATCH_EPOCH=1000002000005 DISPATCH_ATTEMPT=job-7.2.1.3.2 | sort)
  assert_equal "$got" "$want"
}

@test "${SHELL_NAME}: at the int64 edge (its own exec after the loop) the command sees the same environment" {
  prologue DISPATCH_K8S_ADMISSION=775807 DISPATCH_K8S_RESTART=0 DISPATCH_K8S_EPOCH_PREFIX=9223372036854 \
    DISPATCH_K8S_TOKEN_PREFIX=t DISPATCH_K8S_WORKDIR=/ DISPATCH_K8S_EDGE=stale DISPATCH_K8S_R=stale KEEP=me \
    -- /usr/bin/env >"$BATS_TEST_TMPDIR/env"
  run grep -c '^DISPATCH_K8S_' "$BATS_TEST_TMPDIR/env"
  assert_output 0
  run sh -c 'grep -e "^DISPATCH_EPOCH=" -e "^DISPATCH_ATTEMPT=" -e "^KEEP=" "$1" | LC_ALL=C sort' x "$BATS_TEST_TMPDIR/env"
  assert_output $'DISPATCH_ATTEMPT=t.775807.0\nDISPATCH_EPOCH=9223372036854775807\nKEEP=me'
}

@test "${SHELL_NAME}: a refused input never reaches the int64 edge's exec, whatever the prefix and DISPATCH_K8S_EDGE" {
  for p in 1000002 9223372036853 9223372036854; do
    refused DISPATCH_K8S_ADMISSION=01 DISPATCH_K8S_RESTART=0 DISPATCH_K8S_EPOCH_PREFIX=$p DISPATCH_K8S_TOKEN_PREFIX=t \
      DISPATCH_K8S_EDGE=1
    assert_equal "$stderr" "dispatch: DISPATCH_K8S_ADMISSION is not 0 or a decimal of at most 6 digits without a leading zero"
    refused DISPATCH_K8S_ADMISSION=1 DISPATCH_K8S_RESTART=0 DISPATCH_K8S_EPOCH_PREFIX=$p DISPATCH_K8S_TOKEN_PREFIX=$'t\001' \
      DISPATCH_K8S_EDGE=fits
    assert_equal "$stderr" "dispatch: DISPATCH_K8S_TOKEN_PREFIX holds a character that is not visible ASCII"
  done
}

@test "${SHELL_NAME}: an unknown DISPATCH_K8S_* name reaches the command (listing the environment would fork; docs/prologue.md)" {
  run -0 --separate-stderr prologue "${OK_ENV[@]}" DISPATCH_K8S_OTHER=kept -- /usr/bin/printenv DISPATCH_K8S_OTHER
  assert_output "kept"
}

# --- the working directory ---------------------------------------------------

@test "${SHELL_NAME}: enters DISPATCH_K8S_WORKDIR before the command" {
  mkdir -p "$BATS_TEST_TMPDIR/w d"
  run -0 --separate-stderr prologue "${OK_ENV[@]}" "DISPATCH_K8S_WORKDIR=$BATS_TEST_TMPDIR/w d" -- /bin/pwd
  assert_output "$BATS_TEST_TMPDIR/w d"
}

@test "${SHELL_NAME}: a relative DISPATCH_K8S_WORKDIR is relative to the start directory and ignores CDPATH" {
  mkdir -p "$BATS_TEST_TMPDIR/rel" "$BATS_TEST_TMPDIR/elsewhere/rel"
  run -0 --separate-stderr prologue "${OK_ENV[@]}" DISPATCH_K8S_WORKDIR=rel \
    "CDPATH=$BATS_TEST_TMPDIR/elsewhere" -- /bin/pwd
  assert_output "$BATS_TEST_TMPDIR/rel"
}

@test "${SHELL_NAME}: a directory named like an option of cd is entered as named" {
  local w
  for w in - -P -L -- '-e x'; do
    mkdir -p "$BATS_TEST_TMPDIR/$w"
    run -0 --separate-stderr prologue "${OK_ENV[@]}" "DISPATCH_K8S_WORKDIR=$w" "OLDPWD=/" -- /bin/pwd
    assert_output "$BATS_TEST_TMPDIR/$w"
    assert_equal "$stderr" ''
  done
}

@test "${SHELL_NAME}: an empty DISPATCH_K8S_WORKDIR leaves the directory as it is" {
  run -0 --separate-stderr prologue "${OK_ENV[@]}" DISPATCH_K8S_WORKDIR= -- /bin/pwd
  assert_output "$BATS_TEST_TMPDIR"
}

@test "${SHELL_NAME}: a DISPATCH_K8S_WORKDIR that cannot be entered is refused" {
  touch "$BATS_TEST_TMPDIR/file"
  local w
  for w in "$BATS_TEST_TMPDIR/missing" "$BATS_TEST_TMPDIR/file" - missing; do
    refused "${OK_ENV[@]}" "DISPATCH_K8S_WORKDIR=$w" "OLDPWD=/"
    assert_equal "$stderr" "dispatch: cannot enter the directory named by DISPATCH_K8S_WORKDIR"
  done
}
