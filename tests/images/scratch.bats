#!/usr/bin/env bats
# An image without /bin/sh cannot run the prologue: the container runtime
# cannot start the process, podman exits 127 and nothing runs (docs/images.md).

bats_require_minimum_version 1.5.0

setup() {
  load /usr/lib/bats/bats-support/load
  load /usr/lib/bats/bats-assert/load
  REPO=$(cd "$BATS_TEST_DIRNAME/../.." && pwd)
  export CONTAINERS_CONF="$REPO/scripts/containers.conf"
  IMAGE=localhost/dispatch-base/scratch:no-sh
  podman image exists "$IMAGE" || fail "missing image $IMAGE (make images)"
}

@test "scratch (no /bin/sh): the container fails to start with 127 and says /bin/sh is missing" {
  run -127 --separate-stderr podman run --rm --network none \
    -e DISPATCH_K8S_ADMISSION=1 -e DISPATCH_K8S_RESTART=0 -e DISPATCH_K8S_TOKEN_PREFIX=t \
    "$IMAGE" /bin/sh -c "$(cat "$REPO/prologue/prologue.sh")" dispatch-prologue /bin/busybox echo ran
  assert_output ''
  assert_equal "${stderr/*stat \/bin\/sh: no such file or directory*/found}" found
}
