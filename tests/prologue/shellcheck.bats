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
  # From the top, where the scripts' "source" paths are relative to.
  cd "$REPO"
  run -0 .venv/bin/shellcheck -x scripts/*.sh tests/prologue/run-shells.sh tests/prologue/fixtures/measure-seed.sh \
    tests/images/run.sh
  assert_output ''
}

@test "shellcheck: the test driver (images/test-driver/driver) is clean as POSIX sh" {
  run -0 "$REPO/.venv/bin/shellcheck" -s sh "$REPO/images/test-driver/driver"
  assert_output ''
}
