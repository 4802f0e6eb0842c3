#!/usr/bin/env bats
# The prologue forks nothing and runs no external program: between the
# shell's start and the exec of the command, strace sees no clone, fork or
# vfork, and exactly two execve calls (the shell, then the command).

setup() {
  load helpers
  common_setup
}

@test "${SHELL_NAME}: the shell under test runs as a POSIX sh" {
  # Word splitting of an unquoted expansion is sh behaviour; native zsh
  # does not split, so this shows zsh really is in sh emulation.
  run -0 env -i "${BASE_ENV[@]}" "${SH[@]}" -c 'x="a b"; set -- $x; echo $#'
  assert_output 2
}

@test "${SHELL_NAME}: forks nothing between the shell's start and the exec of the command" {
  local log=$BATS_TEST_TMPDIR/strace
  run -0 strace -f -qq -o "$log" -e trace=process,execve \
    env -i "${BASE_ENV[@]}" "${OK_ENV[@]}" "${SH[@]}" -c "$PROLOGUE" dispatch-prologue /bin/true
  if grep -E '(^|[ ])(clone|clone3|fork|vfork)\(' "$log"; then
    fail "the prologue forked"
  fi
  # env itself, then the shell, then the command, and nothing else.
  run grep -c 'execve(' "$log"
  assert_output 3
  run grep 'execve(' "$log"
  assert_line --index 2 --partial 'execve("/bin/true"'
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
