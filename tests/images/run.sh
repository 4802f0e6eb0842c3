#!/usr/bin/env bash
# Runs the image suite once per image (images.bats), then the scratch image's
# (scratch.bats). A missing image fails the run, never skips it. Prints the
# number of cases that ran, and failed, per image.
set -uo pipefail
cd "$(dirname "$0")" || exit 1
BATS=${BATS:-../../.venv/bin/bats}
export CONTAINERS_CONF=$PWD/../../scripts/containers.conf

# name|image|what it honestly is|the host's twin of its /bin/sh
IMAGES=(
  "busybox|localhost/dispatch/sample-trainer:busybox|busybox 1.35 ash, static glibc (Debian's busybox-static)|busybox sh"
  "alpine|localhost/dispatch/sample-trainer:alpine|busybox 1.35 ash, static musl (built here from Debian's busybox source)|busybox sh"
  "debian|localhost/dispatch/sample-trainer:debian|dash 0.5.12 on Debian 12 bookworm (debootstrap minbase)|dash"
)

failed=0 summary=() start=$SECONDS
# suite NAME LABEL FILE [IMAGE]: one bats run, its counts added to the summary.
suite() {
  local name=$1 label=$2 file=$3 image=${4:-} host_sh=${5:-} out rc n bad
  echo "# $name: $label${image:+ ($image)}"
  if [[ -n $image ]] && ! podman image exists "$image"; then
    echo "not ok - $name: missing image $image (make images)"
    summary+=("$(printf '%-8s %-72s missing' "$name" "$label")")
    failed=1
    return
  fi
  out=$(IMAGE=$image IMAGE_NAME=$name IMAGE_LABEL=$label HOST_SH=$host_sh "$BATS" "$file" 2>&1)
  rc=$?
  printf '%s\n' "$out"
  n=$(grep -cE '^(ok|not ok) ' <<<"$out")
  bad=$(grep -cE '^not ok ' <<<"$out")
  summary+=("$(printf '%-8s %-72s %2d cases, %d failed' "$name" "$label" "$n" "$bad")")
  if [[ $rc -ne 0 || $n -eq 0 ]]; then failed=1; fi
}

for entry in "${IMAGES[@]}"; do
  IFS='|' read -r name image label host_sh <<<"$entry"
  suite "$name" "$label" images.bats "$image" "$host_sh"
done
suite scratch "a static binary and no /bin/sh" scratch.bats localhost/dispatch-base/scratch:no-sh

echo "# image cases ($((SECONDS - start)) s):"
printf '#   %s\n' "${summary[@]}"
exit $failed
