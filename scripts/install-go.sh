#!/bin/sh
# Makes a Go of at least GO_MIN (scripts/go-path.sh) available to the builds, and does nothing when
# one is: a `go` on PATH that new, or the toolchain already fetched into GO_HOME.
#
# Otherwise any Go that can download a module (Debian 12's golang-go, 1.19, installed when there is
# no Go at all) fetches the Go toolchain as the go command itself does when it switches toolchains:
# the module golang.org/toolchain@v0.0.1-goGO_VERSION.linux-ARCH, from the module proxy it is
# configured with (GOPROXY), checked against the checksum database (GOSUMDB) like any module. Its
# tree goes to GO_HOME, which go-path.sh puts first on PATH. The module cache is a temporary one,
# removed after; GO_HOME appears whole or not at all (written beside it, then renamed).
# Env: DISPATCH_K8S_CACHE, as the other build scripts.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/go-path.sh
. "$here/go-path.sh"

if command -v go >/dev/null && go_at_least; then
  exit 0
fi
if ! command -v go >/dev/null; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-go.sh: no go on PATH; run as root to install Debian's golang-go, or put Go $GO_MIN or later on PATH" >&2
    exit 1
  fi
  echo "install-go.sh: installing Debian's golang-go to fetch Go $GO_VERSION with" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends golang-go >/dev/null \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends golang-go >/dev/null; }
fi

case $(uname -m) in
  x86_64) arch=amd64 ;;
  aarch64 | arm64) arch=arm64 ;;
  *) echo "install-go.sh: no Go toolchain for machine $(uname -m) (amd64 and arm64 only)" >&2; exit 1 ;;
esac
module=golang.org/toolchain@v0.0.1-go$GO_VERSION.linux-$arch
work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
echo "install-go.sh: fetching $module into $GO_HOME" >&2
# Outside any module (the empty work directory), with a module cache of its own; GOTOOLCHAIN=local
# keeps a newer bootstrap Go from switching toolchains itself.
dir=$(cd "$work" && GOMODCACHE="$work/mod" GOFLAGS=-modcacherw GOTOOLCHAIN=local GO111MODULE=on \
  go mod download -json "$module" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
[ -n "$dir" ] && [ -f "$dir/bin/go" ] || { echo "install-go.sh: $module: downloaded, but no bin/go in it" >&2; exit 1; }
mkdir -p "$(dirname "$GO_HOME")"
rm -rf "$GO_HOME.partial"
cp -R "$dir" "$GO_HOME.partial"
# A module zip keeps no file modes: the go command marks these executable when it switches too.
chmod -R u+w "$GO_HOME.partial"
chmod +x "$GO_HOME.partial"/bin/* "$GO_HOME.partial"/pkg/tool/*/*
got=$("$GO_HOME.partial/bin/go" env GOVERSION)
[ "$got" = "go$GO_VERSION" ] || { echo "install-go.sh: $module: its go says $got, not go$GO_VERSION" >&2; exit 1; }
rm -rf "$GO_HOME"
mv "$GO_HOME.partial" "$GO_HOME"
echo "install-go.sh: $GO_HOME/bin/go is $got" >&2
