#!/usr/bin/env bash
# Builds the local images the tests and the demo run in. No registry is
# reachable, so every base is made here from Debian packages:
#   busybox  Debian's busybox-static (glibc, static) and its applet links
#   alpine   busybox ash on musl, built from Debian's busybox source with
#            musl-gcc (allnoconfig plus ash and a few applets): Alpine's pair
#   debian   debootstrap --variant=minbase bookworm
#   scratch  one static binary and no /bin/sh, to show how that fails
# then the sample trainer (images/sample-trainer.Containerfile) on each base.
# Idempotent: an image is rebuilt only when the hash of its inputs changed.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
export CONTAINERS_CONF="$repo/scripts/containers.conf"
cache=${DISPATCH_CACHE:-$HOME/.cache/dispatch-k8s}/images
mkdir -p "$cache"
BB_VERSION=1.35.0

# image_is_current NAME HASH: the image exists and was built from HASH.
image_is_current() {
  [[ $(podman image inspect --format '{{index .Labels "dispatch.inputs"}}' "$1" 2>/dev/null) == "$2" ]]
}

# import_rootfs NAME HASH DIR: a root filesystem directory as an image.
import_rootfs() {
  tar -C "$3" --numeric-owner -c . |
    podman import -q --change "LABEL dispatch.inputs=$2" --change 'CMD ["/bin/sh"]' - "$1" >/dev/null
  echo "built $1"
}

# link_applets ROOT: a link in ROOT/bin for every applet of ROOT/bin/busybox.
link_applets() {
  local a
  for a in $("$1/bin/busybox" --list); do
    [[ $a == busybox ]] || ln -sf busybox "$1/bin/$a"
  done
}

hash_of() { cat "$@" | sha256sum | cut -c1-16; }
self=$(hash_of "$0")

# --- busybox (glibc, static) ------------------------------------------------
name=localhost/dispatch-base/busybox:1.35-static
h=$(hash_of /usr/bin/busybox <(echo "$self"))
if ! image_is_current "$name" "$h"; then
  root=$(mktemp -d); mkdir -p "$root/bin" "$root/tmp"
  cp /usr/bin/busybox "$root/bin/busybox"
  link_applets "$root"
  import_rootfs "$name" "$h" "$root"; rm -rf "$root"
fi

# --- alpine: busybox ash on musl ----------------------------------------------
musl_bb=$cache/busybox-$BB_VERSION-musl
if [[ ! -x $musl_bb ]]; then
  src=$(mktemp -d)
  # Debian's sources, from the same archive as its binaries: a deb-src twin of
  # the first deb822 sources file (written once; the host stays as configured).
  if ! grep -rqs '^Types: deb-src' /etc/apt/sources.list.d/; then
    first=$(find /etc/apt/sources.list.d -name "*.sources" | sort | head -n1)
    sed 's/^Types: deb$/Types: deb-src/' "$first" >/etc/apt/sources.list.d/dispatch-deb-src.sources
    apt-get update -qq
  fi
  (cd "$src" && apt-get source -qq busybox >/dev/null 2>&1)
  cd "$src"/busybox-$BB_VERSION
  make allnoconfig >/dev/null
  for o in BUSYBOX STATIC ASH SH_IS_ASH BASH_IS_NONE ASH_OPTIMIZE_FOR_SIZE ASH_ECHO ASH_TEST ASH_PRINTF \
    FEATURE_SH_MATH FEATURE_SH_MATH_64 ECHO TEST TEST1 TEST2 PRINTF ENV TRUE FALSE CAT PWD LS \
    SLEEP ID MKDIR CHMOD; do
    sed -i "s/^# CONFIG_$o is not set/CONFIG_$o=y/" .config
  done
  { yes '' || true; } | make oldconfig >/dev/null 2>&1
  make -j"$(nproc)" CC=musl-gcc busybox >"$cache/busybox-musl-build.log" 2>&1
  cp busybox "$musl_bb.tmp" && mv "$musl_bb.tmp" "$musl_bb"
  cd "$repo"; rm -rf "$src"
fi
name=localhost/dispatch-base/alpine:busybox-1.35-ash-musl-static
h=$(hash_of "$musl_bb" <(echo "$self"))
if ! image_is_current "$name" "$h"; then
  root=$(mktemp -d); mkdir -p "$root/bin" "$root/tmp"
  cp "$musl_bb" "$root/bin/busybox"
  link_applets "$root"
  import_rootfs "$name" "$h" "$root"; rm -rf "$root"
fi

# --- debian: debootstrap minbase ----------------------------------------------
deb_tar=$cache/debian-bookworm-minbase.tar
if [[ ! -s $deb_tar ]]; then
  root=$(mktemp -d)
  debootstrap --variant=minbase bookworm "$root" >"$cache/debootstrap.log" 2>&1
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" --numeric-owner -cf "$deb_tar.tmp" . && mv "$deb_tar.tmp" "$deb_tar"
  rm -rf "$root"
fi
name=localhost/dispatch-base/debian:bookworm-minbase
h=$(hash_of <(stat -c '%s %Y' "$deb_tar") <(echo "$self"))
if ! image_is_current "$name" "$h"; then
  podman import -q --change "LABEL dispatch.inputs=$h" --change 'CMD ["/bin/bash"]' "$deb_tar" "$name" >/dev/null
  echo "built $name"
fi

# --- scratch: no /bin/sh -------------------------------------------------------
name=localhost/dispatch-base/scratch:no-sh
h=$(hash_of "$musl_bb" <(echo "$self"))
if ! image_is_current "$name" "$h"; then
  root=$(mktemp -d); mkdir -p "$root/bin"
  cp "$musl_bb" "$root/bin/busybox"
  import_rootfs "$name" "$h" "$root"; rm -rf "$root"
fi

# --- the sample trainer on each base -----------------------------------------
for base in busybox:1.35-static alpine:busybox-1.35-ash-musl-static debian:bookworm-minbase; do
  flavour=${base%%:*}
  name=localhost/dispatch/sample-trainer:$flavour
  h=$(hash_of images/sample-trainer.Containerfile images/sample-trainer/train \
    <(podman image inspect --format '{{.Id}}' "localhost/dispatch-base/$base"))
  if ! image_is_current "$name" "$h"; then
    podman build -q --isolation chroot --build-arg "BASE=localhost/dispatch-base/$base" \
      --label "dispatch.inputs=$h" -f images/sample-trainer.Containerfile -t "$name" . >/dev/null
    echo "built $name"
  fi
done
podman image prune -f >/dev/null
