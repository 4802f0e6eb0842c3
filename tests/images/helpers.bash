# Helpers of the image suite (images.bats, scratch.bats); run.sh sets
# IMAGE (the image to run), IMAGE_NAME (busybox, alpine, debian: the first
# word of every test name), IMAGE_LABEL (what the image honestly is) and
# HOST_SH (the host's twin of the image's /bin/sh: `busybox sh`, `dash`).

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

REPO=$(cd "$BATS_TEST_DIRNAME/../.." && pwd)
export CONTAINERS_CONF="$REPO/scripts/containers.conf"
PROLOGUE=$(<"$REPO/prologue/prologue.sh")

# A valid admission: A=2 J=1 for generation 1, submission 3 of job-9.
OK=(-e DISPATCH_K8S_ADMISSION=2 -e DISPATCH_K8S_RESTART=1
  -e DISPATCH_K8S_EPOCH_PREFIX=1000003 -e DISPATCH_K8S_TOKEN_PREFIX=job-9.3.0)

# require_image: a missing image fails the test, never skips it.
require_image() {
  [[ -n ${IMAGE:-} ]] || fail "IMAGE is not set (run tests/images/run.sh)"
  podman image exists "$IMAGE" || fail "missing image $IMAGE (make images)"
}

# in_image [PODMAN-RUN-OPTION]... -- CMD...: one container of $IMAGE whose
# entry point is the prologue, exactly as a TrainJob's trainer container:
#   command: [/bin/sh, -c, <prologue>, dispatch-prologue]  args: CMD...
in_image() {
  local opts=()
  while [[ $1 != -- ]]; do
    opts+=("$1")
    shift
  done
  shift
  podman run --rm --network none "${opts[@]}" "$IMAGE" /bin/sh -c "$PROLOGUE" dispatch-prologue "$@"
}

# in_cases: the `try` lines on stdin (tests/images/cases.sh), all in one
# container of $IMAGE, run by the image's /bin/sh; one output line per case.
in_cases() {
  local script
  script="PROLOGUE=\$1"$'\n'"$(<"$BATS_TEST_DIRNAME/cases.sh")"$'\n'"$(cat)"
  podman run --rm --network none "$IMAGE" /bin/sh -c "$script" cases "$PROLOGUE"
}

# on_host: the same, on the host, by $HOST_SH, from /.
on_host() {
  local script
  script="PROLOGUE=\$1 PROLOGUE_SH='$HOST_SH' CASE_DIR='$BATS_TEST_TMPDIR'"$'\n'
  script+="$(<"$BATS_TEST_DIRNAME/cases.sh")"$'\n'"cd /"$'\n'"$(cat)"
  $HOST_SH -c "$script" cases "$PROLOGUE"
}

# check_cases CASES: runs the `try` lines CASES in the image. Stdin holds one
# line per case, "<case> -> <status> out=[<stdout>]"; each result must be that
# line plus err=[...], empty when the status is 0 and exactly one
# "dispatch: ..." line when it is 125. Then the whole transcript, stderr
# wording included, must equal the host's twin shell's: the prologue behaves
# the same inside the image as in the shell its own suite (tests/prologue)
# pins down.
check_cases() {
  local got want host i
  got=$(in_cases <<<"$1") || fail "the cases did not run in $IMAGE: $got"
  mapfile -t want
  mapfile -t lines <<<"$got"
  for i in "${!want[@]}"; do
    case ${want[i]} in
      *" -> 0 out=["*) [[ ${lines[i]-} == "${want[i]} err=[]" ]] ;;
      *" -> 125 out=["*) [[ ${lines[i]-} == "${want[i]} err=[dispatch: "*"]" && ${lines[i]} != *'\n'* ]] ;;
      *) [[ ${lines[i]-} == "${want[i]} err=["* ]] ;;
    esac || fail "$(printf 'case %d\n  expected: %s err=[...]\n  actual:   %s' "$i" "${want[i]}" "${lines[i]-<none>}")"
  done
  assert_equal "${#lines[@]}" "${#want[@]}"
  host=$(on_host <<<"$1")
  [[ $got == "$host" ]] || fail "$(printf 'the image differs from the host'"'"'s %s:\n%s' "$HOST_SH" \
    "$(diff <(echo "$host") <(echo "$got"))")"
}
