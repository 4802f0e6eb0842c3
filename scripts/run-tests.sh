#!/usr/bin/env bash
# Runs every test suite; `make test` calls this after installing what they need.
# Usage: scripts/run-tests.sh [prologue|python]   (default: all)
# A missing shell, image or binary fails the run; nothing is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
what=${1:-all}
failed=0

# Runs one step of the suite and says how long it took; a failure marks the run failed.
step() {
  local began=$SECONDS
  "$@" || failed=1
  echo "run-tests.sh: $* took $((SECONDS - began)) s"
}

# The podman Docker-compatible service, for code that speaks the Docker API.
# shellcheck source=scripts/podman-service.sh
. scripts/podman-service.sh

if [[ $what == all || $what == prologue ]]; then
  step bash tests/prologue/run-shells.sh
  step bash tests/images/run.sh
fi
if [[ $what == prologue ]]; then
  # The property test (nine shells against the Python reference) and the Docker-API image
  # tests; in `all` they run with the rest of the pytest suite below.
  pytest -p no:cacheprovider tests/prologue tests/images || failed=1
fi
if [[ $what == all || $what == python ]]; then
  # The slowest 25 tests are listed at the end of every run; every test's time is in
  # .test-results/pytest.xml (JUnit XML).
  step pytest -p no:cacheprovider --durations=25 --junitxml=.test-results/pytest.xml tests
fi
exit $failed
