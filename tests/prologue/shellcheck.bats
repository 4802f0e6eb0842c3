#!/usr/bin/env bats
# The prologue is checked as sh (never -s bash: that would hide bashisms).

setup() {
  load helpers
}

@test "shellcheck: prologue.sh is clean as POSIX sh" {
  run -0 "$REPO/.venv/bin/shellcheck" -s sh "$REPO/prologue/prologue.sh"
  assert_output ''
}

@test "shellcheck: the project's own shell scripts are clean" {
  run -0 "$REPO/.venv/bin/shellcheck" -x "$REPO"/scripts/*.sh "$REPO/tests/prologue/run-shells.sh" "$REPO/tests/images/run.sh"
  assert_output ''
}
