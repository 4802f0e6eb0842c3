#!/usr/bin/env bash
# Runs the image suite once per image; a missing image fails the run.
# Prints the number of cases per image.
set -uo pipefail
cd "$(dirname "$0")" || exit 1
BATS=${BATS:-../../.venv/bin/bats}
# image|honest label
IMAGES=(
  "localhost/dispatch/sample-trainer:busybox|busybox: busybox 1.35 ash, static glibc (Debian busybox-static)"
  "localhost/dispatch/sample-trainer:alpine|alpine: busybox 1.35 ash, static musl (built from Debian's source)"
  "localhost/dispatch/sample-trainer:debian|debian: bookworm minbase, dash"
)
failed=0 summary=()
for entry in "${IMAGES[@]}"; do
  image=${entry%%|*} label=${entry#*|}
  out=$(IMAGE=$image IMAGE_LABEL=$label "$BATS" images.bats 2>&1)
  rc=$?
  printf '%s\n' "$out"
  n=$(grep -cE '^(ok|not ok) ' <<<"$out")
  summary+=("$(printf '%-60s %2d cases, %d failed' "$label" "$n" "$(grep -cE '^not ok ' <<<"$out")")")
  if [[ $rc -ne 0 || $n -eq 0 ]]; then failed=1; fi
done
out=$("$BATS" scratch.bats 2>&1) || failed=1
printf '%s\n' "$out"
summary+=("$(printf '%-60s %2d cases' "scratch: no /bin/sh" "$(grep -cE '^(ok|not ok) ' <<<"$out")")")
echo "# image cases:"
printf '#   %s\n' "${summary[@]}"
exit $failed
