#!/usr/bin/env bats
# The prologue inside a real OCI image, run with podman exactly as Kubernetes
# starts a trainer container: /bin/sh -c <prologue> dispatch-prologue CMD...,
# its inputs in the container's environment (podman run -e).
# run.sh runs this file once per image: busybox, alpine, debian.
# A table test runs many cases in one container (cases.sh) to keep the suite
# to about a dozen containers per image.

bats_require_minimum_version 1.5.0
load helpers

setup() {
  require_image
}

@test "${IMAGE_NAME}: /bin/sh is ${IMAGE_LABEL}" {
  case $IMAGE_NAME in
    busybox)
      run -0 in_image "${OK[@]}" -- busybox
      assert_line --index 0 --regexp '^BusyBox v1\.35\.0 \(Debian 1:1\.35\.0-[^)]*\) multi-call binary\.$'
      ;;
    alpine)
      # Built here, so its banner carries the build date rather than Debian's version.
      run -0 in_image "${OK[@]}" -- busybox
      assert_line --index 0 --regexp '^BusyBox v1\.35\.0 \([0-9-]+ [0-9:]+ UTC\) multi-call binary\.$'
      run -0 in_image "${OK[@]}" -- busybox --list
      assert_output "$(printf '%s\n' ash chmod env mkdir sh)"
      ;;
    debian)
      run -0 in_image "${OK[@]}" -- sh -c \
        'readlink /bin/sh; dpkg-query -W -f="\${Version}\n" dash; read -r v </etc/debian_version; echo "$v"'
      assert_line --index 0 dash
      assert_line --index 1 --regexp '^0\.5\.12-'
      assert_line --index 2 --regexp '^12\.[0-9]+$'
      ;;
    *) fail "no identity check for image $IMAGE_NAME" ;;
  esac
}

@test "${IMAGE_NAME}: the trainer runs as PID 1 in the workdir with the epoch and attempt" {
  run -0 --separate-stderr in_image "${OK[@]}" -e DISPATCH_K8S_WORKDIR=/work -- train x 'y z'
  assert_output "pid=1 cwd=/work DISPATCH_EPOCH=1000003000003 DISPATCH_ATTEMPT=job-9.3.0.2.1 args=x y z"
  assert_equal "$stderr" ''
}

@test "${IMAGE_NAME}: the command is PID 1 and sees the epoch, the attempt and its own variables but no DISPATCH_K8S_*" {
  run -0 --separate-stderr in_image "${OK[@]}" -e DISPATCH_K8S_WORKDIR=/ -e KEEP='a b' -e DISPATCH_OTHER=kept -- \
    sh -c 'echo "pid=$$"; exec env'
  assert_line --index 0 pid=1
  assert_line DISPATCH_EPOCH=1000003000003
  assert_line DISPATCH_ATTEMPT=job-9.3.0.2.1
  assert_line 'KEEP=a b'
  assert_line DISPATCH_OTHER=kept
  refute_line --partial DISPATCH_K8S_
  assert_equal "$stderr" ''
}

@test "${IMAGE_NAME}: accepts A and J at and around every bound, with and without an epoch prefix" {
  local show='sh -c '\''echo "$DISPATCH_EPOCH $DISPATCH_ATTEMPT"'\'''
  check_cases "$(cat <<EOF
try A=1 J=0 P= T=j.1.0 -- $show
try A=9 J=10 P= T=j.1.0 -- $show
try A=999999 J=0 P= T=j.1.0 -- $show
try A=1 J=999998 P= T=j.1.0 -- $show
try A=1 J=0 P=1 T=a.b.1.0 -- $show
try A=12 J=3 P=1000000000000 T=j.0.0 -- $show
try A=775807 J=0 P=9223372036854 T=j.36854.0 -- $show
try A=775806 J=1 P=9223372036854 T=j.36854.0 -- $show
EOF
)" <<'EOF'
A=1 J=0 P= T=j.1.0 -- 'sh' '-c' 'echo "$DISPATCH_EPOCH $DISPATCH_ATTEMPT"' -> 0 out=[1 j.1.0.1.0]
A=9 J=10 P= T=j.1.0 -- 'sh' '-c' 'echo "$DISPATCH_EPOCH $DISPATCH_ATTEMPT"' -> 0 out=[19 j.1.0.9.10]
A=999999 J=0 P= T=j.1.0 -- 'sh' '-c' 'echo "$DISPATCH_EPOCH $DISPATCH_ATTEMPT"' -> 0 out=[999999 j.1.0.999999.0]
A=1 J=999998 P= T=j.1.0 -- 'sh' '-c' 'echo "$DISPATCH_EPOCH $DISPATCH_ATTEMPT"' -> 0 out=[999999 j.1.0.1.999998]
A=1 J=0 P=1 T=a.b.1.0 -- 'sh' '-c' 'echo "$DISPATCH_EPOCH $DISPATCH_ATTEMPT"' -> 0 out=[1000001 a.b.1.0.1.0]
A=12 J=3 P=1000000000000 T=j.0.0 -- 'sh' '-c' 'echo "$DISPATCH_EPOCH $DISPATCH_ATTEMPT"' -> 0 out=[1000000000000000015 j.0.0.12.3]
A=775807 J=0 P=9223372036854 T=j.36854.0 -- 'sh' '-c' 'echo "$DISPATCH_EPOCH $DISPATCH_ATTEMPT"' -> 0 out=[9223372036854775807 j.36854.0.775807.0]
A=775806 J=1 P=9223372036854 T=j.36854.0 -- 'sh' '-c' 'echo "$DISPATCH_EPOCH $DISPATCH_ATTEMPT"' -> 0 out=[9223372036854775807 j.36854.0.775806.1]
EOF
}

@test "${IMAGE_NAME}: refuses every class of bad A and J with 125 and one line, running nothing" {
  check_cases "$(cat <<'EOF'
try J=1 P= T=t -- echo ran
try A= J=1 P= T=t -- echo ran
try A=+1 J=1 P= T=t -- echo ran
try A=-1 J=1 P= T=t -- echo ran
try A=' 1' J=1 P= T=t -- echo ran
try A='1 ' J=1 P= T=t -- echo ran
try A=010 J=1 P= T=t -- echo ran
try A=08 J=1 P= T=t -- echo ran
try A=0x1 J=1 P= T=t -- echo ran
try A=1e3 J=1 P= T=t -- echo ran
try A=1000000 J=1 P= T=t -- echo ran
try A=99999999999999999999 J=1 P= T=t -- echo ran
try A='1;echo x' J=1 P= T=t -- echo ran
try A=1 P= T=t -- echo ran
try A=1 J=01 P= T=t -- echo ran
try A=1 J=-0 P= T=t -- echo ran
try A=1 J=9223372036854775807 P= T=t -- echo ran
EOF
)" <<'EOF'
J=1 P= T=t -- 'echo' 'ran' -> 125 out=[]
A= J=1 P= T=t -- 'echo' 'ran' -> 125 out=[]
A=+1 J=1 P= T=t -- 'echo' 'ran' -> 125 out=[]
A=-1 J=1 P= T=t -- 'echo' 'ran' -> 125 out=[]
A= 1 J=1 P= T=t -- 'echo' 'ran' -> 125 out=[]
A=1  J=1 P= T=t -- 'echo' 'ran' -> 125 out=[]
A=010 J=1 P= T=t -- 'echo' 'ran' -> 125 out=[]
A=08 J=1 P= T=t -- 'echo' 'ran' -> 125 out=[]
A=0x1 J=1 P= T=t -- 'echo' 'ran' -> 125 out=[]
A=1e3 J=1 P= T=t -- 'echo' 'ran' -> 125 out=[]
A=1000000 J=1 P= T=t -- 'echo' 'ran' -> 125 out=[]
A=99999999999999999999 J=1 P= T=t -- 'echo' 'ran' -> 125 out=[]
A=1;echo x J=1 P= T=t -- 'echo' 'ran' -> 125 out=[]
A=1 P= T=t -- 'echo' 'ran' -> 125 out=[]
A=1 J=01 P= T=t -- 'echo' 'ran' -> 125 out=[]
A=1 J=-0 P= T=t -- 'echo' 'ran' -> 125 out=[]
A=1 J=9223372036854775807 P= T=t -- 'echo' 'ran' -> 125 out=[]
EOF
}

@test "${IMAGE_NAME}: refuses A = 0, R at the bound, a bad prefix, an epoch past 64 bits, no token prefix and no command" {
  check_cases "$(cat <<'EOF'
try A=0 J=5 P= T=t -- echo ran
try A=999999 J=1 P= T=t -- echo ran
try A=500000 J=500000 P= T=t -- echo ran
try A=1 J=0 P=01 T=t -- echo ran
try A=1 J=0 P=-1 T=t -- echo ran
try A=1 J=0 P=10000000000000 T=t -- echo ran
try A=775807 J=1 P=9223372036854 T=t -- echo ran
try A=1 J=0 P=9223373000000 T=t -- echo ran
try A=1 J=0 P= -- echo ran
try A=1 J=0 P= T= -- echo ran
try A=1 J=0 P= T=t --
try A=1 J=0 P= T=t -- ''
EOF
)" <<'EOF'
A=0 J=5 P= T=t -- 'echo' 'ran' -> 125 out=[]
A=999999 J=1 P= T=t -- 'echo' 'ran' -> 125 out=[]
A=500000 J=500000 P= T=t -- 'echo' 'ran' -> 125 out=[]
A=1 J=0 P=01 T=t -- 'echo' 'ran' -> 125 out=[]
A=1 J=0 P=-1 T=t -- 'echo' 'ran' -> 125 out=[]
A=1 J=0 P=10000000000000 T=t -- 'echo' 'ran' -> 125 out=[]
A=775807 J=1 P=9223372036854 T=t -- 'echo' 'ran' -> 125 out=[]
A=1 J=0 P=9223373000000 T=t -- 'echo' 'ran' -> 125 out=[]
A=1 J=0 P= -- 'echo' 'ran' -> 125 out=[]
A=1 J=0 P= T= -- 'echo' 'ran' -> 125 out=[]
A=1 J=0 P= T=t -- -> 125 out=[]
A=1 J=0 P= T=t -- '' -> 125 out=[]
EOF
}

@test "${IMAGE_NAME}: honours an absolute or relative workdir and refuses one it cannot enter" {
  check_cases "$(cat <<'EOF'
try A=1 J=0 P= T=t W=/tmp -- sh -c pwd
try A=1 J=0 P= T=t W=tmp -- sh -c pwd
try A=1 J=0 P= T=t W=/nonexistent -- echo ran
try A=1 J=0 P= T=t W=- -- echo ran
EOF
)" <<'EOF'
A=1 J=0 P= T=t W=/tmp -- 'sh' '-c' 'pwd' -> 0 out=[/tmp]
A=1 J=0 P= T=t W=tmp -- 'sh' '-c' 'pwd' -> 0 out=[/tmp]
A=1 J=0 P= T=t W=/nonexistent -- 'echo' 'ran' -> 125 out=[]
A=1 J=0 P= T=t W=- -- 'echo' 'ran' -> 125 out=[]
EOF
}

@test "${IMAGE_NAME}: a refusal is the container's exit 125 with one line on stderr and nothing run" {
  run -125 --separate-stderr in_image -e DISPATCH_K8S_ADMISSION=010 -e DISPATCH_K8S_RESTART=1 \
    -e DISPATCH_K8S_TOKEN_PREFIX=t -- sh -c 'echo ran'
  assert_output ''
  # The one line tells this 125 from podman's own (its errors also exit 125).
  assert_equal "$stderr" \
    "dispatch: DISPATCH_K8S_ADMISSION is not 0 or a decimal of at most 6 digits without a leading zero"
}

@test "${IMAGE_NAME}: arguments with spaces, quotes, globs and newlines arrive intact" {
  local args=('a b' '"q"' "'s'" '*' '/b?n' '$HOME' '`id`' $'x\ny' '' ' ')
  run -0 --separate-stderr in_image "${OK[@]}" -- sh -c 'printf "[%s]\n" "$@"' argv0 "${args[@]}"
  assert_output "$(printf '[%s]\n' "${args[@]}")"
  assert_equal "$stderr" ''
}

@test "${IMAGE_NAME}: the command's exit status is passed through, and 127 for a command not found" {
  run -42 in_image "${OK[@]}" -- sh -c 'exit 42'
  check_cases "$(cat <<'EOF'
try A=1 J=0 P= T=t -- sh -c 'exit 0'
try A=1 J=0 P= T=t -- sh -c 'exit 1'
try A=1 J=0 P= T=t -- sh -c 'exit 255'
try A=1 J=0 P= T=t -- /no/such/command
EOF
)" <<'EOF'
A=1 J=0 P= T=t -- 'sh' '-c' 'exit 0' -> 0 out=[]
A=1 J=0 P= T=t -- 'sh' '-c' 'exit 1' -> 1 out=[]
A=1 J=0 P= T=t -- 'sh' '-c' 'exit 255' -> 255 out=[]
A=1 J=0 P= T=t -- '/no/such/command' -> 127 out=[]
EOF
}
