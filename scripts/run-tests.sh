#!/usr/bin/env bash
# Runs every test suite; `make test` calls this after installing what they need.
# Usage: scripts/run-tests.sh [prologue|python]   (default: all)
# Every test's outcome and time is in .test-results/<lane>.xml (JUnit XML).
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

# The pytest suites in two phases. In the first, two lanes run side by side on the host's two
# cores: the suites that start no node (under `all`, after the shells and the images) and the
# end-to-end suite and the benches' smoke runs, which spend most of their time waiting on the
# node. The second phase runs alone what must not share the host: the fault suite (its bounds
# are timed, and a starved apiserver's webhooks lag behind), the suites that compare the host's
# links, namespaces and mounts before and after a cluster (tests/node, tests/cluster: the first
# lane's containers come and go) and the dispatcher's suite (its leases are short).
BESIDE_THE_NODE=(tests/e2e tests/bench)
ALONE=(tests/faults tests/dispatcher tests/node tests/cluster)
mapfile -t WITHOUT_NODE < <(find tests -mindepth 1 -maxdepth 1 -type d ! -name __pycache__ | sort |
  grep -vxF -f <(printf '%s\n' "${BESIDE_THE_NODE[@]}" "${ALONE[@]}"))
RESULTS=.test-results
mkdir -p "$RESULTS"

# pytest over the given suites; its JUnit XML (every test's outcome and time) named after LANE.
# shellcheck disable=SC2329  # invoked through `step`
suite() {
  local lane=$1
  shift
  pytest -p no:cacheprovider --durations=25 --junitxml="$RESULTS/$lane.xml" "$@"
}

# The lane without a node: its output goes to a file, printed whole once it ends.
without_node() {
  if [[ $what == all ]]; then
    step bash tests/prologue/run-shells.sh
    step bash tests/images/run.sh
  fi
  step suite without-node "${WITHOUT_NODE[@]}"
  return $failed
}

if [[ $what == prologue ]]; then
  step bash tests/prologue/run-shells.sh
  step bash tests/images/run.sh
  # The property test (nine shells against the Python reference) and the Docker-API image tests.
  step pytest -p no:cacheprovider tests/prologue tests/images
fi
if [[ $what == all || $what == python ]]; then
  began=$SECONDS
  without_node >"$RESULTS/without-node.log" 2>&1 &
  lane=$!
  step suite beside-the-node "${BESIDE_THE_NODE[@]}"
  wait "$lane" || failed=1
  echo "run-tests.sh: the lane without a node (its output follows) ----------------------------"
  cat "$RESULTS/without-node.log"
  echo "run-tests.sh: the first phase took $((SECONDS - began)) s"
  step suite alone "${ALONE[@]}"
fi
exit $failed
