#!/usr/bin/env bash
# Builds, from their own Go modules at pinned versions into a cache outside the
# repo, one of three sets, and does nothing when the cache already holds it:
# - `controllers` (the default): the controllers the end-to-end suite runs for
#   real - Kubeflow Trainer's controller manager, JobSet's controller, Kueue's
#   manager, kwok (for scale tests only) - and the node's container runtime,
#   containerd with its runc shim and its ctr client;
# - `services`: the local cluster's own services - CoreDNS (its DNS, run as a
#   pod) and the container registry the node pulls from (distribution's
#   `registry`);
# - `tools`: helm, which the chart's tests install the release's Helm chart
#   with (tests/release/test_chart.py).
#
# Invariants:
# - Each binary is built inside that release's own module directory, as
#   `go mod download` put it in the (read-only) module cache: against its own
#   go.mod and go.sum, so the dependency graph is exactly upstream's and no
#   wrapper module can drift. The checksum database pins each version's
#   source. (`go install M/PKG@V` would do the same but asks the proxy for the
#   module's version list, which it refuses for some of these modules.)
# - The versions live in the tables below and devcluster/versions.txt only;
#   each set's cache directory is named by a hash of its table, so a bump
#   builds into a fresh directory.
# - A binary's stamp is written after it is built: an interrupted build redoes
#   only what has no stamp.
#
# Usage: build-controllers.sh [controllers|services|tools]
# Prints the bin directory on stdout as its last line; progress goes to stderr.
# Env: DISPATCH_K8S_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/dispatch-k8s),
# DISPATCH_JOBSET_VERSION and DISPATCH_KUEUE_VERSION (the version set, below).
#
# Version sets: JobSet's and Kueue's releases in `controllers` come from
# devcluster/versions.txt, its first row unless DISPATCH_JOBSET_VERSION or
# DISPATCH_KUEUE_VERSION names another version of its column (anything else is
# refused, exit 2). Each set has a table of its own, so a cache directory of its
# own; the default set's table reads as it always has. A binary that another
# cache directory of the same kind holds, stamped with the same module@version
# and package, is hard-linked from there instead of built again.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# pick COLUMN NAME VARIABLE VALUE: VALUE (the column's first when empty) if the column names it.
pick() {
  local allowed value
  allowed=$(awk -v c="$1" '{ sub(/#.*/, "") } NF { print $c }' "$here/versions.txt" | awk '!seen[$0]++')
  value=${4:-$(head -n1 <<<"$allowed")}
  if ! grep -qxF -- "$value" <<<"$allowed"; then
    echo "build-controllers.sh: $3=$value: not a tested $2 version (devcluster/versions.txt has $(paste -sd, - <<<"$allowed" | sed 's/,/, /g'))" >&2
    return 2
  fi
  echo "$value"
}
jobset=$(pick 3 jobset DISPATCH_JOBSET_VERSION "${DISPATCH_JOBSET_VERSION:-}") || exit 2
kueue=$(pick 4 kueue DISPATCH_KUEUE_VERSION "${DISPATCH_KUEUE_VERSION:-}") || exit 2

# binary  module@version  main package inside the module
controllers="
trainer-controller-manager github.com/kubeflow/trainer/v2@v2.3.0 ./cmd/trainer-controller-manager
jobset-controller sigs.k8s.io/jobset@$jobset .
kueue sigs.k8s.io/kueue@$kueue ./cmd/kueue
kwok sigs.k8s.io/kwok@v0.8.0 ./cmd/kwok
containerd github.com/containerd/containerd/v2@v2.4.2 ./cmd/containerd
containerd-shim-runc-v2 github.com/containerd/containerd/v2@v2.4.2 ./cmd/containerd-shim-runc-v2
ctr github.com/containerd/containerd/v2@v2.4.2 ./cmd/ctr
"
services='
coredns github.com/coredns/coredns@v1.15.0 .
registry github.com/distribution/distribution/v3@v3.1.2 ./cmd/registry
'
tools='
helm helm.sh/helm/v4@v4.3.2 ./cmd/helm
kustomize sigs.k8s.io/kustomize/kustomize/v5@v5.8.1 .
'
case ${1:-controllers} in
  controllers) table=$controllers prefix=e2e ;;
  services) table=$services prefix=services ;;
  tools) table=$tools prefix=tools ;;
  *) echo "build-controllers.sh: unknown set ${1} (controllers, services or tools)" >&2; exit 2 ;;
esac

# shellcheck source=scripts/go-path.sh
. "$(cd "$(dirname "$0")/.." && pwd)/scripts/go-path.sh"
{ command -v go >/dev/null && go_at_least; } || { echo "build-controllers.sh: no go $GO_MIN or later on PATH (make deps fetches one)" >&2; exit 1; }

cache_root=${DISPATCH_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dispatch-k8s}
bin_dir=$cache_root/$prefix-$(printf '%s' "$table" | sha256sum | cut -c1-12)/bin
mkdir -p "$bin_dir"
# One build at a time per cache (make test and a fixture may both ask).
exec 9>"$bin_dir/.lock"
flock 9
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

while read -r name module pkg; do
  [[ -n $name ]] || continue
  stamp=$bin_dir/.$name.stamp
  want="$module $pkg"
  if [[ -x $bin_dir/$name && -f $stamp && $(cat "$stamp") == "$want" ]]; then
    echo "build-controllers.sh: cached: $name ($want)" >&2
    continue
  fi
  for other in "$cache_root/$prefix"-*/bin; do
    if [[ $other != "$bin_dir" && -x $other/$name && -f $other/.$name.stamp && $(cat "$other/.$name.stamp") == "$want" ]]; then
      ln -f "$other/$name" "$bin_dir/$name"
      echo "$want" >"$stamp"
      echo "build-controllers.sh: linked: $name ($want) from $other" >&2
      continue 2
    fi
  done
  echo "build-controllers.sh: building $name from $want" >&2
  start=$(date +%s)
  dir=$(go mod download -json "$module" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [[ -n $dir && -f $dir/go.mod ]] || { echo "build-controllers.sh: go mod download $module gave no source dir" >&2; exit 1; }
  (cd "$dir" && go build -trimpath -ldflags="-s -w" -o "$bin_dir/$name.tmp" "$pkg")
  mv "$bin_dir/$name.tmp" "$bin_dir/$name"
  echo "$want" >"$stamp"
  echo "build-controllers.sh: built $name in $(($(date +%s) - start))s ($(du -h "$bin_dir/$name" | cut -f1))" >&2
done <<<"$table"
echo "$bin_dir"
