#!/usr/bin/env bash
# Builds the local images the tests and the demo run in (docs/images.md).
# No registry is reachable, so every base is made here from Debian packages:
#   busybox  Debian's busybox-static (static glibc) and its applet links
#   alpine   busybox ash on musl, built statically from Debian's busybox
#            source with musl-gcc (allnoconfig plus images/base/alpine/
#            busybox.config): Alpine's pair
#   debian   debootstrap --variant=minbase bookworm (/bin/sh is dash)
#   scratch  one static test binary and no /bin/sh, to show how that fails
#   pause    the local node's pod sandbox (images/base/pause/pause.c), static
#   python   Debian's python3.11 on the debian minbase (images/base/python), the
#            base of the sidecar, dispatcher and controller images
#   python and busybox for the other architecture of the release (arm64 on an
#            amd64 machine: tagged ...-arm64): the same Debian packages of that
#            architecture, unpacked and never run (docs/images.md)
# then images/sample-trainer.Containerfile on each of the four with /bin/sh
# (on python, its `train --checkpoint` publishes through fence/dispatch_fence).
# and images/sample-trainer-s3.Containerfile on python: the same trainer with
# the fence's s3 extra (obstore), for make demo's object store.
#
# Idempotent: each image carries the label dispatch.inputs, a hash of what it
# is made of (its input files and the text of the function that builds it);
# an image whose label matches is left alone. Slow steps (the musl busybox,
# the debootstrap tree) are cached under $DISPATCH_CACHE (~/.cache/dispatch-k8s).
# Never touches /etc/containers: podman reads scripts/containers.conf.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
export CONTAINERS_CONF="$repo/scripts/containers.conf"
cache=${DISPATCH_CACHE:-$HOME/.cache/dispatch-k8s}/images
mkdir -p "$cache"
# This machine's architecture, and the other one a release is built for (release/contexts.py ARCHES).
host_arch=$(dpkg --print-architecture)
case $host_arch in
  amd64) other_arch=arm64 ;;
  arm64) other_arch=amd64 ;;
  *) echo "build-images: a release is built on amd64 or arm64, not $host_arch" >&2; exit 1 ;;
esac

for tool in podman runc busybox debootstrap musl-gcc dpkg-source readelf curl; do
  command -v "$tool" >/dev/null || { echo "build-images: $tool is missing (make deps)" >&2; exit 1; }
done

# hash_of FILE...: a short hash of the files' contents, in order.
hash_of() { cat "$@" | sha256sum | cut -c1-16; }

# ensure NAME BUILDER INPUT...: runs `BUILDER NAME HASH` unless the image NAME
# exists with the label dispatch.inputs=HASH; removes the image it replaced.
ensure() {
  local name=$1 builder=$2 h old start
  shift 2
  h=$(hash_of <(declare -f "$builder" import_rootfs link_applets) "$@")
  old=$(podman image inspect --format '{{.Id}} {{index .Labels "dispatch.inputs"}}' "$name" 2>/dev/null || true)
  if [[ ${old#* } == "$h" ]]; then
    return 0
  fi
  start=$SECONDS
  "$builder" "$name" "$h"
  echo "built $name in $((SECONDS - start)) s"
  # The replaced image, if nothing else uses it (never a global prune:
  # other images and builds on the machine may share this storage).
  [[ -z $old ]] || podman rmi "${old%% *}" >/dev/null 2>&1 || true
}

# import_rootfs NAME HASH DIR CMD: the directory DIR as a one-layer image.
import_rootfs() {
  tar -C "$3" --numeric-owner --owner=0 --group=0 -c . |
    podman import -q --change "LABEL dispatch.inputs=$2" --change "CMD $4" - "$1" >/dev/null
}

# link_applets ROOT: ROOT/bin/APPLET -> busybox for every applet it has.
link_applets() {
  local a
  for a in $("$1/bin/busybox" --list); do
    [[ $a == busybox ]] || ln -sf busybox "$1/bin/$a"
  done
}

# --- busybox: Debian's busybox-static --------------------------------------
build_busybox() {
  local root
  root=$(mktemp -d)
  mkdir -p "$root/bin" "$root/tmp"
  chmod 0755 "$root" && chmod 1777 "$root/tmp"
  cp "$(command -v busybox)" "$root/bin/busybox"
  link_applets "$root"
  import_rootfs "$1" "$2" "$root" '["/bin/sh"]'
  rm -rf "$root"
}
ensure localhost/dispatch-base/busybox:1.35-static build_busybox "$(command -v busybox)"

# --- alpine: busybox ash on musl, from Debian's source ----------------------
# fetch_busybox_source DIR: Debian's busybox source, unpacked in DIR. apt has
# no deb-src entry by default; one is added beside the host's own entries
# (same archives, Types: deb-src) in a file of our own.
fetch_busybox_source() {
  local src=/etc/apt/sources.list.d/dispatch-k8s-deb-src.sources first
  if ! apt-cache showsrc busybox 2>/dev/null | grep -q '^Package: busybox'; then
    # Debian's own archive first (signed by its keyring), not a third party's.
    first=$({ grep -l 'debian-archive-keyring' /etc/apt/sources.list.d/*.sources
      grep -l '^Types: deb$' /etc/apt/sources.list.d/*.sources; } 2>/dev/null | head -n1 || true)
    if [[ -n $first ]]; then
      sed 's/^Types: deb$/Types: deb-src/' "$first" >"$src"
    elif grep -qs '^deb ' /etc/apt/sources.list; then
      sed -n 's/^deb /deb-src /p' /etc/apt/sources.list >"${src%.sources}.list"
    else
      echo "build-images: no Debian apt source to derive a deb-src entry from" >&2
      return 1
    fi
    apt-get update -qq
  fi
  (cd "$1" && apt-get source -qq busybox >/dev/null 2>&1)
}

# build_musl_busybox OUT: allnoconfig, the fragment's options turned on, each
# checked to have stuck, compiled statically with musl-gcc.
build_musl_busybox() {
  local tmp dir line
  tmp=$(mktemp -d)
  fetch_busybox_source "$tmp"
  dir=$(echo "$tmp"/busybox-*/)
  make -C "$dir" allnoconfig >/dev/null 2>&1
  while IFS= read -r line; do
    [[ $line == CONFIG_*=y ]] && sed -i "s/^# ${line%=y} is not set\$/$line/" "$dir/.config"
  done <images/base/alpine/busybox.config
  { yes '' || true; } | make -C "$dir" oldconfig >/dev/null 2>&1
  while IFS= read -r line; do
    [[ $line != CONFIG_*=y ]] || grep -qx "$line" "$dir/.config" ||
      { echo "build-images: busybox rejected $line" >&2; return 1; }
  done <images/base/alpine/busybox.config
  make -C "$dir" -j"$(nproc)" CC=musl-gcc busybox >"$cache/busybox-musl-build.log" 2>&1
  # Static: no program interpreter (a dynamic musl binary would need /lib/ld-musl-*).
  if readelf -l "$dir/busybox" | grep -q INTERP; then
    echo "build-images: the musl busybox is not static" >&2
    return 1
  fi
  cp "$dir/busybox" "$1.tmp" && mv "$1.tmp" "$1"
  rm -rf "$tmp"
}
bb_version=$(dpkg-query -W -f='${Version}' busybox-static)
musl_bb=$cache/busybox-musl-$(hash_of images/base/alpine/busybox.config <(echo "$bb_version" && declare -f build_musl_busybox))
if [[ ! -x $musl_bb ]]; then
  start=$SECONDS
  build_musl_busybox "$musl_bb"
  echo "built the musl busybox ($bb_version) in $((SECONDS - start)) s"
  # Binaries of earlier fragments or recipes are not used again.
  find "$cache" -maxdepth 1 -name 'busybox-musl-*' ! -name "${musl_bb##*/}" ! -name '*.log' -delete
fi

build_alpine() {
  local root
  root=$(mktemp -d)
  mkdir -p "$root/bin" "$root/tmp"
  chmod 0755 "$root" && chmod 1777 "$root/tmp"
  cp "$musl_bb" "$root/bin/busybox"
  link_applets "$root"
  import_rootfs "$1" "$2" "$root" '["/bin/sh"]'
  rm -rf "$root"
}
ensure localhost/dispatch-base/alpine:busybox-1.35-ash-musl-static build_alpine "$musl_bb"

# --- debian: debootstrap minbase -------------------------------------------
deb_tar=$cache/debian-bookworm-minbase.tar
if [[ ! -s $deb_tar ]]; then
  start=$SECONDS
  root=$(mktemp -d)
  debootstrap --variant=minbase bookworm "$root" >"$cache/debootstrap.log" 2>&1
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" --numeric-owner -cf "$deb_tar.tmp" . && mv "$deb_tar.tmp" "$deb_tar"
  rm -rf "$root"
  echo "debootstrapped bookworm minbase in $((SECONDS - start)) s"
fi
build_debian() {
  podman import -q --change "LABEL dispatch.inputs=$2" --change 'CMD ["/bin/bash"]' "$deb_tar" "$1" >/dev/null
}
# The tarball's size and time stand for its content (hashing 120 MB each run
# would cost more than the rest of a cached run).
ensure localhost/dispatch-base/debian:bookworm-minbase build_debian <(stat -c '%s %Y' "$deb_tar")

# --- scratch: a static binary and no /bin/sh ----------------------------------
build_scratch() {
  local root
  root=$(mktemp -d)
  chmod 0755 "$root"
  musl-gcc -static -Os -s -o "$root/hello" images/base/scratch/hello.c
  import_rootfs "$1" "$2" "$root" '["/hello"]'
  rm -rf "$root"
}
ensure localhost/dispatch-base/scratch:no-sh build_scratch images/base/scratch/hello.c

# --- pause: the sandbox image of the local node's containerd -----------------
# build_pause NAME HASH: images/base/pause/pause.c, static with musl, alone.
build_pause() {
  local root
  root=$(mktemp -d)
  chmod 0755 "$root"
  musl-gcc -static -Os -s -o "$root/pause" images/base/pause/pause.c
  import_rootfs "$1" "$2" "$root" '["/pause"]'
  rm -rf "$root"
}
ensure localhost/dispatch-base/pause:1 build_pause images/base/pause/pause.c

# --- python: the base of our own daemon images (sidecar, dispatcher) --------
# build_python NAME HASH: images/base/python on the debian minbase, with
# Debian's python3.11 packages fetched by name.
build_python() {
  local ctx log=$cache/python-build.log
  ctx=$(mktemp -d)
  chmod 0755 "$ctx"  # apt-get download writes as the _apt user
  # dpkg --force-depends warns about the libraries left out on purpose: the
  # output goes to a log, shown only when the build fails.
  # shellcheck disable=SC2046 # one package name per line
  if ! { (cd "$ctx" && apt-get download -q $(cat "$repo/images/base/python/packages.txt")) &&
    cp images/base/python/Containerfile "$ctx/" &&
    podman build -q --isolation chroot --build-arg BASE=localhost/dispatch-base/debian:bookworm-minbase \
      --label "dispatch.inputs=$2" -t "$1" "$ctx"; } >"$log" 2>&1; then
    cat "$log" >&2
    return 1
  fi
  rm -rf "$ctx"
}
ensure localhost/dispatch-base/python:3.11-bookworm build_python \
  images/base/python/Containerfile images/base/python/packages.txt \
  <(podman image inspect --format '{{.Id}}' localhost/dispatch-base/debian:bookworm-minbase)

# --- the other architecture's bases (arm64 on amd64) --------------------------
# Nothing of that architecture runs here (binfmt_misc may be empty, and no
# emulator is needed to build): debootstrap --foreign only downloads and
# unpacks the minbase, whose maintainer scripts never run, and the packages on
# top are unpacked with dpkg-deb -x. They are images/base/python/packages.txt
# and busybox-static, fetched by apt from the host's own sources with an
# apt configuration of their architecture under the cache (never the host's
# architectures, lists or status), so both architectures carry the same
# versions. images/mkroot.py reads these roots and runs none of their programs.
# apt_other ARGS...: apt-get for $other_arch, on its own lists under the cache.
apt_other() {
  local d=$cache/apt-$other_arch
  mkdir -p "$d/lists/partial" "$d/archives/partial"
  [[ -e $d/status ]] || : >"$d/status"
  apt-get -q -o "APT::Architecture=$other_arch" -o "APT::Architectures::=$other_arch" \
    -o "Dir::State::Lists=$d/lists" -o "Dir::State::status=$d/status" -o "Dir::Cache=$d" \
    -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache= "$@"
}
# fetch_other DIR PACKAGE...: the $other_arch .debs of PACKAGE... into DIR.
fetch_other() {
  local dir=$1
  shift
  chmod 0777 "$dir"  # apt-get download writes as the _apt user
  if ! { apt_other update >"$cache/apt-$other_arch.log" 2>&1 &&
         (cd "$dir" && apt_other download "$@" >>"$cache/apt-$other_arch.log" 2>&1); }; then
    cat "$cache/apt-$other_arch.log" >&2
    return 1
  fi
}
# import_other NAME HASH DIR: the directory DIR as a one-layer image of $other_arch.
import_other() {
  tar -C "$3" --numeric-owner --owner=0 --group=0 -c . |
    podman import -q --arch "$other_arch" --change "LABEL dispatch.inputs=$2" - "$1" >/dev/null
}
other_tar=$cache/debian-bookworm-minbase-$other_arch.tar
if [[ ! -s $other_tar ]]; then
  start=$SECONDS
  root=$(mktemp -d)
  debootstrap --foreign --arch="$other_arch" --variant=minbase bookworm "$root" >"$cache/debootstrap-$other_arch.log" 2>&1
  # The first stage unpacks the required packages; the rest of the minbase, unpacked alike.
  for deb in "$root"/var/cache/apt/archives/*.deb; do dpkg-deb -x "$deb" "$root"; done
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root/debootstrap"
  tar -C "$root" --numeric-owner -cf "$other_tar.tmp" . && mv "$other_tar.tmp" "$other_tar"
  rm -rf "$root"
  echo "debootstrapped bookworm minbase for $other_arch (--foreign) in $((SECONDS - start)) s"
fi
# build_python_other NAME HASH: the minbase of $other_arch with the Python base's packages unpacked.
build_python_other() {
  local root deb
  root=$(mktemp -d)
  chmod 0755 "$root"
  tar -C "$root" -xf "$other_tar"
  mkdir "$root/debs"
  # shellcheck disable=SC2046 # one package name per line
  fetch_other "$root/debs" $(cat images/base/python/packages.txt)
  for deb in "$root"/debs/*.deb; do dpkg-deb -x "$deb" "$root"; done
  rm -rf "$root/debs"
  ln -sf python3.11 "$root/usr/bin/python3"
  import_other "$1" "$2" "$root"
  rm -rf "$root"
}
ensure "localhost/dispatch-base/python:3.11-bookworm-$other_arch" build_python_other \
  images/base/python/packages.txt <(stat -c '%s %Y' "$other_tar") <(declare -f apt_other fetch_other import_other)
# build_busybox_other NAME HASH: busybox-static of $other_arch, at this machine's busybox-static
# version, with the applet links of this machine's busybox (the same build: its --list).
build_busybox_other() {
  local root
  root=$(mktemp -d)
  mkdir -p "$root/bin" "$root/tmp" "$root/debs"
  chmod 0755 "$root" && chmod 1777 "$root/tmp"
  fetch_other "$root/debs" "busybox-static=$bb_version"
  dpkg-deb --fsys-tarfile "$root"/debs/busybox-static_*.deb | tar -xO ./bin/busybox >"$root/bin/busybox"
  chmod 0755 "$root/bin/busybox"
  rm -rf "$root/debs"
  for a in $(busybox --list); do
    [[ $a == busybox ]] || ln -sf busybox "$root/bin/$a"
  done
  import_other "$1" "$2" "$root"
  rm -rf "$root"
}
ensure "localhost/dispatch-base/busybox:1.35-static-$other_arch" build_busybox_other \
  <(echo "$bb_version") <(declare -f apt_other fetch_other import_other)

# --- the sample trainer on each base ----------------------------------------
# build_trainer NAME HASH: images/sample-trainer.Containerfile on $base. The
# python flavour is the one whose `train --checkpoint` can publish (python3).
build_trainer() {
  podman build -q --isolation chroot --build-arg "BASE=localhost/dispatch-base/$base" \
    --label "dispatch.inputs=$2" -f images/sample-trainer.Containerfile -t "$1" . >/dev/null
}
for base in busybox:1.35-static alpine:busybox-1.35-ash-musl-static debian:bookworm-minbase python:3.11-bookworm; do
  ensure "localhost/dispatch/sample-trainer:${base%%:*}" build_trainer \
    images/sample-trainer.Containerfile images/sample-trainer/train \
    fence/dispatch_fence/{__init__,__main__,checkpoint,cli,model,posix,roots}.py \
    <(podman image inspect --format '{{.Id}}' "localhost/dispatch-base/$base")
done

# --- the sample trainer with the fence's s3 extra (make demo's fence stage) --
# build_trainer_s3 NAME HASH: images/sample-trainer-s3.Containerfile on the
# Python base, in a context of train, the fence's files its s3 extra imports
# and the wheels of the extra (obstore at fence/pyproject.toml's pin, and
# typing_extensions at constraints.txt's), fetched by pip for CPython 3.11
# on this machine's architecture and unpacked here (the base has no pip),
# and this machine's CA bundle (Debian's ca-certificates): obstore's HTTP
# client loads the system's CA certificates before any request, TLS or not.
# The DCP storage layer's modules too (train-dcp imports them; torch is not in the image: the demo
# mounts the torch of build-torch-venv.sh, devcluster/demo_fence.py).
fence_s3_files=(fence/dispatch_fence/{__init__,__main__,aws,checkpoint,cli,client,model,objectstore,posix,roots,s3,transfer,dcp_storage,dcp_reader}.py)
fence_s3_wheels() {
  grep -i '^obstore==' constraints.txt
  grep -i '^typing[-_]extensions==' constraints.txt
}
build_trainer_s3() {
  local ctx py=$repo/.venv/bin/python w
  [[ -x $py ]] || py=python3
  ctx=$(mktemp -d)
  mkdir "$ctx/dispatch_fence" "$ctx/site" "$ctx/wheels"
  cp images/sample-trainer/train images/sample-trainer/train-dcp /etc/ssl/certs/ca-certificates.crt "$ctx/"
  cp "${fence_s3_files[@]}" "$ctx/dispatch_fence/"
  # shellcheck disable=SC2046 # one requirement per line
  "$py" -m pip download -q --no-deps --only-binary :all: --implementation cp --python-version 3.11 \
    --platform "manylinux2014_$(uname -m)" -d "$ctx/wheels" $(fence_s3_wheels) >"$cache/trainer-s3-wheels.log" 2>&1 ||
    { cat "$cache/trainer-s3-wheels.log" >&2; return 1; }
  for w in "$ctx"/wheels/*.whl; do "$py" -m zipfile -e "$w" "$ctx/site/"; done
  podman build -q --isolation chroot --build-arg BASE=localhost/dispatch-base/python:3.11-bookworm \
    --label "dispatch.inputs=$2" -f images/sample-trainer-s3.Containerfile -t "$1" "$ctx" >/dev/null
  rm -rf "$ctx"
}
ensure localhost/dispatch/sample-trainer:python-s3 build_trainer_s3 images/sample-trainer-s3.Containerfile \
  images/sample-trainer/train images/sample-trainer/train-dcp "${fence_s3_files[@]}" <(fence_s3_wheels) /etc/ssl/certs/ca-certificates.crt \
  <(podman image inspect --format '{{.Id}}' localhost/dispatch-base/python:3.11-bookworm)

# --- the sidecar verifier, as the local cluster's runtimes name it (devcluster/local.py SIDECAR_IMAGE)
# build_sidecar NAME HASH: images/sidecar.Containerfile, whose build stage runs
# on the Python base and makes a minimal root (images/mkroot.py), in a
# context holding only what it copies. `make demo` runs it beside the trainer.
build_sidecar() {
  local ctx
  ctx=$(mktemp -d)
  mkdir "$ctx/src" "$ctx/mkroot"
  cp -rL sidecar toolkit "$ctx/src/"
  rm -f "$ctx/src/toolkit/data/release.json"
  cp images/mkroot.py images/elf.py "$ctx/mkroot/"
  find "$ctx" -name __pycache__ -prune -exec rm -rf {} +
  podman build -q --isolation chroot --build-arg BASE=localhost/dispatch-base/python:3.11-bookworm \
    --build-arg "BUILDPLATFORM=linux/$host_arch" \
    --label "dispatch.inputs=$2" -f images/sidecar.Containerfile -t "$1" "$ctx" >/dev/null
  rm -rf "$ctx"
  # The build stage's images (the Python base plus the root, ~180 MB each), labelled in the Containerfile.
  # shellcheck disable=SC2046 # one image ID per line
  podman rmi $(podman images -q --filter label=dispatch.stage=python-build) >/dev/null 2>&1 || true
}
ensure localhost/dispatch/sidecar:dev build_sidecar images/sidecar.Containerfile images/mkroot.py images/elf.py \
  sidecar/*.py toolkit/*.py <(podman image inspect --format '{{.Id}}' localhost/dispatch-base/python:3.11-bookworm)

# --- the test driver: what the dispatcher's driver Jobs run on the local node
# build_test_driver NAME HASH: images/test-driver.Containerfile on the busybox
# base. Its launch request picks what it does (images/test-driver/driver).
build_test_driver() {
  podman build -q --isolation chroot --build-arg BASE=localhost/dispatch-base/busybox:1.35-static \
    --label "dispatch.inputs=$2" -f images/test-driver.Containerfile -t "$1" . >/dev/null
}
ensure localhost/dispatch/test-driver:dev build_test_driver images/test-driver.Containerfile \
  images/test-driver/driver <(podman image inspect --format '{{.Id}}' localhost/dispatch-base/busybox:1.35-static)
