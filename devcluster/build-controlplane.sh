#!/usr/bin/env bash
# Builds the local cluster's control plane (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler), its node agents (kubelet, kube-proxy)
# and the kubectl of the same release
# from the Go module beside this script into a cache outside the repo, and does
# nothing when the cache already holds that exact set.
#
# Invariants:
# - The versions come from go.mod alone; the cache directory and the stamp name
#   them, so a version bump builds into a fresh directory and never mixes.
# - The stamp is written last: an interrupted build leaves no stamp and is
#   redone; a stamp means every binary in the bin directory was built from this
#   go.sum. A stamp for other versions clears the directory first.
# - KUBEBUILDER_ASSETS (the envtest convention) wins per binary: a binary found
#   there is not built, and only the missing ones are. setup-envtest ships etcd,
#   kube-apiserver and kubectl only, so then just the controller manager and the
#   scheduler are built here (the harness takes each binary from the assets
#   first, then from this cache).
#
# Prints the bin directory on stdout as its last line; progress goes to stderr.
# Env: DISPATCH_K8S_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/dispatch-k8s).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"

# shellcheck source=scripts/go-path.sh
. "$here/../scripts/go-path.sh"
{ command -v go >/dev/null && go_at_least; } || { echo "build-controlplane.sh: no go $GO_MIN or later on PATH (make deps fetches one)" >&2; exit 1; }

k8s_version=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' go.mod)
etcd_version=$(awk '$1 == "go.etcd.io/etcd/server/v3" && $2 ~ /^v/ {print $2; exit}' go.mod)
[[ -n $k8s_version && -n $etcd_version ]] || { echo "build-controlplane.sh: cannot read versions from go.mod" >&2; exit 1; }

cache_root=${DISPATCH_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dispatch-k8s}
bin_dir=$cache_root/k8s-$k8s_version/bin
stamp=$bin_dir/.stamp
sum=$(sha256sum go.sum | cut -c1-16)
want="kubernetes=$k8s_version etcd=$etcd_version go.sum=$sum"

binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
missing=()
for b in "${binaries[@]}"; do
  if [[ -n ${KUBEBUILDER_ASSETS:-} && -x $KUBEBUILDER_ASSETS/$b ]]; then
    continue
  fi
  missing+=("$b")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "build-controlplane.sh: all binaries found in KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS" >&2
  echo "$KUBEBUILDER_ASSETS"
  exit 0
fi
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  rm -rf "$bin_dir"
fi
build=()
for b in "${missing[@]}"; do
  [[ -x $bin_dir/$b ]] || build+=("$b")
done
if [[ ${#build[@]} -eq 0 ]]; then
  echo "build-controlplane.sh: cached: $bin_dir ($want)" >&2
  echo "$bin_dir"
  exit 0
fi

echo "build-controlplane.sh: building ${build[*]} ($want) into $bin_dir (takes a while on a small machine)" >&2
start=$(date +%s)
rm -f "$stamp"
mkdir -p "$bin_dir"
export CGO_ENABLED=0
# Fill the version fields kube's own build sets, so /version reports the release.
minor=${k8s_version#v1.}
minor=${minor%%.*}
vpkg=k8s.io/component-base/version
ldflags="-s -w -X $vpkg.gitVersion=$k8s_version -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor"
ldflags+=" -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=1970-01-01T00:00:00Z"
# The kube commands in one invocation so they share one link-time graph walk.
kube=()
for b in "${build[@]}"; do
  [[ $b == etcd ]] || kube+=("k8s.io/kubernetes/cmd/$b")
done
if [[ ${#kube[@]} -gt 0 ]]; then
  go build -trimpath -ldflags="$ldflags" -o "$bin_dir/" "${kube[@]}"
fi
# etcd's main package path ends in a major-version suffix, so name it explicitly.
if [[ " ${build[*]} " == *" etcd "* ]]; then
  go build -trimpath -ldflags="-s -w" -o "$bin_dir/etcd" go.etcd.io/etcd/server/v3
fi
for b in "${build[@]}"; do
  [[ -x $bin_dir/$b ]] || { echo "build-controlplane.sh: $b was not produced" >&2; exit 1; }
done
echo "$want" >"$stamp"
echo "build-controlplane.sh: built in $(($(date +%s) - start))s" >&2
echo "$bin_dir"
