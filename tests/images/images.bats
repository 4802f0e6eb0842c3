#!/usr/bin/env bats
# The prologue inside real OCI images, run with podman exactly as Kubernetes
# would start a trainer container: /bin/sh -c <prologue> dispatch-prologue CMD.
# run.sh runs this file once per image (IMAGE, IMAGE_LABEL).

bats_require_minimum_version 1.5.0

setup() {
  load /usr/lib/bats/bats-support/load
  load /usr/lib/bats/bats-assert/load
  REPO=$(cd "$BATS_TEST_DIRNAME/../.." && pwd)
  PROLOGUE=$(cat "$REPO/prologue/prologue.sh")
  export CONTAINERS_CONF="$REPO/scripts/containers.conf"
  podman image exists "$IMAGE" || fail "missing image $IMAGE (make images)"
}

# in_image [-e VAR=VALUE]... -- CMD...: the prologue in the image under test.
in_image() {
  local opts=()
  while [[ $1 != -- ]]; do opts+=("$1"); shift; done
  shift
  podman run --rm --network none "${opts[@]}" "$IMAGE" /bin/sh -c "$PROLOGUE" dispatch-prologue "$@"
}

OK=(-e DISPATCH_K8S_ADMISSION=2 -e DISPATCH_K8S_RESTART=1
  -e DISPATCH_K8S_EPOCH_PREFIX=1000003 -e DISPATCH_K8S_TOKEN_PREFIX=job-9.3.0)

@test "${IMAGE_LABEL}: the trainer runs as PID 1 in the workdir with the epoch and attempt" {
  run -0 --separate-stderr in_image "${OK[@]}" -e DISPATCH_K8S_WORKDIR=/work -- train x 'y z'
  assert_output "pid=1 cwd=/work DISPATCH_EPOCH=1000003000003 DISPATCH_ATTEMPT=job-9.3.0.2.1 args=x y z"
  assert_equal "$stderr" ''
}

@test "${IMAGE_LABEL}: the largest epoch that fits 64 bits, and one past it refused" {
  run -0 in_image -e DISPATCH_K8S_ADMISSION=775807 -e DISPATCH_K8S_RESTART=0 \
    -e DISPATCH_K8S_EPOCH_PREFIX=9223372036854 -e DISPATCH_K8S_TOKEN_PREFIX=t -- train
  assert_output --partial "DISPATCH_EPOCH=9223372036854775807 "
  run -125 --separate-stderr in_image -e DISPATCH_K8S_ADMISSION=775807 -e DISPATCH_K8S_RESTART=1 \
    -e DISPATCH_K8S_EPOCH_PREFIX=9223372036854 -e DISPATCH_K8S_TOKEN_PREFIX=t -- train
  assert_output ''
  assert_equal "$stderr" "dispatch: epoch 9223372036854775808 does not fit a signed 64-bit integer"
}

@test "${IMAGE_LABEL}: refuses a leading zero, a huge value and A = 0 with 125 and one line, running nothing" {
  local a
  for a in 010 99999999999999999999 0; do
    run -125 --separate-stderr in_image -e "DISPATCH_K8S_ADMISSION=$a" -e DISPATCH_K8S_RESTART=1 \
      -e DISPATCH_K8S_TOKEN_PREFIX=t -- train
    assert_output ''
    [[ $stderr == "dispatch: DISPATCH_K8S_ADMISSION "* && $stderr != *$'\n'* ]] || fail "A=$a: $stderr"
  done
}

@test "${IMAGE_LABEL}: refuses R at the bound and a missing J" {
  run -125 --separate-stderr in_image -e DISPATCH_K8S_ADMISSION=999999 -e DISPATCH_K8S_RESTART=1 \
    -e DISPATCH_K8S_TOKEN_PREFIX=t -- train
  assert_equal "$stderr" "dispatch: R = A + J = 1000000 reached the bound 1000000"
  run -125 --separate-stderr in_image -e DISPATCH_K8S_ADMISSION=1 -e DISPATCH_K8S_TOKEN_PREFIX=t -- train
  assert_equal "$stderr" "dispatch: DISPATCH_K8S_RESTART is empty or not set"
}

@test "${IMAGE_LABEL}: refuses a workdir that does not exist" {
  run -125 --separate-stderr in_image "${OK[@]}" -e DISPATCH_K8S_WORKDIR=/nonexistent -- train
  assert_output ''
  assert_equal "$stderr" "dispatch: cannot enter the directory named by DISPATCH_K8S_WORKDIR"
}

@test "${IMAGE_LABEL}: arguments with spaces, quotes, globs and newlines arrive intact" {
  run -0 in_image "${OK[@]}" -- printf '[%s]\n' 'a b' '"q"' "'s'" '*' '$HOME' $'x\ny' ''
  assert_output "$(printf '[%s]\n' 'a b' '"q"' "'s'" '*' '$HOME' $'x\ny' '')"
}

@test "${IMAGE_LABEL}: the command's exit status is the container's" {
  run -42 in_image "${OK[@]}" -- /bin/sh -c 'exit 42'
}

@test "${IMAGE_LABEL}: the command sees no DISPATCH_K8S_* variable" {
  run -0 in_image "${OK[@]}" -e DISPATCH_K8S_WORKDIR=/ -e KEEP=me -- env
  refute_line --partial DISPATCH_K8S_
  assert_line KEEP=me
  assert_line DISPATCH_EPOCH=1000003000003
  assert_line DISPATCH_ATTEMPT=job-9.3.0.2.1
}
