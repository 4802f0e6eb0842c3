#!/bin/sh
# Installs the Debian packages the tests and the demo need; does nothing when
# they are all present. Run as root on Debian 12 (bookworm).
set -eu
PACKAGES="
  dash bash busybox-static posh mksh yash ksh zsh
  bats-assert bats-support
  strace time hyperfine valgrind
  podman runc uidmap
  containernetworking-plugins iptables
  debootstrap musl-tools dpkg-dev build-essential
  qemu-user-static skopeo
  git ca-certificates openssl curl
  python3 python3-venv
"
missing=
for p in $PACKAGES; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "installing:$missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086 # the list is meant to split into words
apt-get install -y -qq --no-install-recommends $missing >/dev/null
