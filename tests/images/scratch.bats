#!/usr/bin/env bats
# An image without /bin/sh cannot run the prologue: the runtime cannot start
# the container's process at all, so nothing runs and no "dispatch:" line is
# printed. Measured here and documented in docs/images.md: podman (runc)
# exits 127; Kubernetes (containerd, runc) reports the container Terminated,
# reason StartError, exit code 128, with the same "stat /bin/sh" message.

bats_require_minimum_version 1.5.0
load helpers

setup() {
  IMAGE=localhost/dispatch-base/scratch:no-sh
  require_image
}

@test "scratch: the image itself works: its static binary runs as the entry point" {
  run -0 --separate-stderr podman run --rm --network none "$IMAGE"
  assert_output "hello from a scratch image"
}

@test "scratch: with no /bin/sh the prologue cannot start: podman exits 127 naming /bin/sh, nothing runs" {
  run -127 --separate-stderr in_image "${OK[@]}" -- /hello
  assert_output ''
  assert_equal "${stderr//$'\n'/ }" \
    'Error: runc: runc create failed: unable to start container process: exec: "/bin/sh": stat /bin/sh: no such file or directory: OCI runtime attempted to invoke a command that was not found'
}
