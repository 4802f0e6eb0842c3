#!/usr/bin/env bash
# make demo: wraps a sample trainer command with the prologue (toolkit wrap,
# as an image build pipeline would), then runs it in each of the three local
# images as a TrainJob's executions would start: first admission, a JobSet
# restart, a re-admission after preemption; and one refusal.
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF=$PWD/scripts/containers.conf
toolkit=.venv/bin/toolkit

mapfile -d '' -t wrapped < <("$toolkit" wrap -o json -- train --epochs 3 |
  .venv/bin/python -c 'import json,sys; sys.stdout.write("".join(a + "\0" for a in json.load(sys.stdin)))')
echo "toolkit wrap -- train --epochs 3"
echo "  -> [${wrapped[0]}, ${wrapped[1]}, <prologue: $(wc -c <prologue/prologue.sh) bytes>, ${wrapped[*]:3}]"

# run IMAGE A J: one execution of job "llama-ft" generation 2, submission 7, attempt 0.
run() {
  podman run --rm --network none \
    -e DISPATCH_K8S_ADMISSION="$2" -e DISPATCH_K8S_RESTART="$3" \
    -e DISPATCH_K8S_EPOCH_PREFIX=2000007 -e DISPATCH_K8S_TOKEN_PREFIX=llama-ft.7.0 \
    -e DISPATCH_K8S_WORKDIR=/work \
    "$1" "${wrapped[@]}"
}

for flavour in busybox alpine debian; do
  image=localhost/dispatch/sample-trainer:$flavour
  echo
  echo "== $image"
  echo "first admission (A=1, J=0):";           run "$image" 1 0
  echo "JobSet restarted it (A=1, J=1):";       run "$image" 1 1
  echo "preempted, admitted again (A=2, J=1):"; run "$image" 2 1
done
echo
echo "== a refusal: A=010 (octal in some shells, decimal in others) is never guessed"
rc=0
run localhost/dispatch/sample-trainer:debian 010 1 || rc=$?
echo "exit status $rc"
[[ $rc -eq 125 ]]
