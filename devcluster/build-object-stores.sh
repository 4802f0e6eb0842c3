#!/usr/bin/env bash
# Builds the object-store servers the checkpoint fence is tested against, from
# their own Go modules at pinned versions, into the user cache:
#   versitygw        an S3 gateway over a directory, with conditional writes
#                    (PutObject If-None-Match: * and If-Match: <ETag>)
#   versitygw-1.0.14 the same gateway before it had them: it ignores both
#                    headers, the real "store without conditional writes"
#   fake-gcs-server  the GCS emulator; its JSON API honours ifGenerationMatch
#   fake-gcs-server-1.17.0  the emulator before it had preconditions: it ignores
#                    ifGenerationMatch, the GCS "store without conditional writes"
#
# Invariants (as devcluster/build-controllers.sh):
# - Each binary is built inside its release's own module directory (as `go mod
#   download` put it, checksum-verified) against its own go.mod and go.sum.
# - The versions live in the table below only; the cache directory is named by a
#   hash of the table, so a bump builds into a fresh directory.
# - A binary's stamp is written after it is built: an interrupted build redoes
#   only what has no stamp. Idempotent and quick when everything is built.
#
# Usage: build-object-stores.sh [NAME...]: the named binaries of the table only
# (make demo needs versitygw alone), else all of them.
# Prints the bin directory on stdout as its last line; progress goes to stderr.
# Env: DISPATCH_K8S_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/dispatch-k8s).
set -euo pipefail

# binary  module@version  main package inside the module
table='
versitygw github.com/versity/versitygw@v1.8.0 ./cmd/versitygw
versitygw-1.0.14 github.com/versity/versitygw@v1.0.14 ./cmd/versitygw
fake-gcs-server github.com/fsouza/fake-gcs-server@v1.56.1 .
fake-gcs-server-1.17.0 github.com/fsouza/fake-gcs-server@v1.17.0 .
'

# shellcheck source=scripts/go-path.sh
. "$(cd "$(dirname "$0")/.." && pwd)/scripts/go-path.sh"
{ command -v go >/dev/null && go_at_least; } || { echo "build-object-stores.sh: no go $GO_MIN or later on PATH (make deps fetches one)" >&2; exit 1; }

cache_root=${DISPATCH_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dispatch-k8s}
bin_dir=$cache_root/object-stores-$(printf '%s' "$table" | sha256sum | cut -c1-12)/bin
mkdir -p "$bin_dir"
# One build at a time per cache (make test and a test fixture may both ask).
exec 9>"$bin_dir/.lock"
flock 9
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
only=" $* "
for name in "$@"; do
  grep -q "^$name " <<<"$table" || { echo "build-object-stores.sh: $name is not in the table" >&2; exit 2; }
done

while read -r name module pkg; do
  [[ -n $name ]] || continue
  [[ $# -eq 0 || $only == *" $name "* ]] || continue
  stamp=$bin_dir/.$name.stamp
  want="$module $pkg"
  if [[ -x $bin_dir/$name && -f $stamp && $(cat "$stamp") == "$want" ]]; then
    echo "build-object-stores.sh: cached: $name ($want)" >&2
    continue
  fi
  echo "build-object-stores.sh: building $name from $want" >&2
  start=$(date +%s)
  dir=$(go mod download -json "$module" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [[ -n $dir && -f $dir/go.mod ]] || { echo "build-object-stores.sh: go mod download $module gave no source dir" >&2; exit 1; }
  (cd "$dir" && go build -trimpath -ldflags="-s -w" -o "$bin_dir/$name.tmp" "$pkg")
  mv "$bin_dir/$name.tmp" "$bin_dir/$name"
  echo "$want" >"$stamp"
  echo "build-object-stores.sh: built $name in $(($(date +%s) - start))s ($(du -h "$bin_dir/$name" | cut -f1))" >&2
done <<<"$table"
echo "$bin_dir"
