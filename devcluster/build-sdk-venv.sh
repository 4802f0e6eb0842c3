#!/usr/bin/env bash
# Makes the virtualenv the Kubeflow SDK runs in, for the tests that drive the
# cluster as an SDK user does (TrainerClient().train(...)): kubeflow with every
# package it resolves to pinned by devcluster/sdk-constraints.txt. Kept out of
# the project's .venv because the SDK brings its own kubernetes client, older
# than the one constraints.txt pins, and a test runs it as a process of its
# own. Cached in the user cache like the torch venv: the directory is named by
# a hash of the pins, the constraints and the interpreter, and a stamp written
# last marks it complete. A venv holding a package the constraints do not pin
# is refused: every version in it is the constraints' own.
#
# Prints the venv's python on stdout as its last line; progress goes to stderr.
# Env: DISPATCH_K8S_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/dispatch-k8s).
set -euo pipefail

pins='kubeflow==0.5.0'
constraints=$(cd "$(dirname "$0")" && pwd)/sdk-constraints.txt

cache_root=${DISPATCH_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dispatch-k8s}
python=$(command -v python3)
version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
key="$pins $(sha256sum <"$constraints" | cut -c1-12)"
dir=$cache_root/sdk-venv-$(printf '%s %s' "$key" "$version" | sha256sum | cut -c1-12)
mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9
if [[ -f $dir/.stamp && $(cat "$dir/.stamp") == "$key" ]]; then
  echo "build-sdk-venv.sh: cached: $pins" >&2
else
  echo "build-sdk-venv.sh: installing $pins (python $version)" >&2
  start=$(date +%s)
  rm -rf "$dir/venv"
  "$python" -m venv "$dir/venv"
  # shellcheck disable=SC2086 # the pins are words
  "$dir/venv/bin/pip" install -q -c "$constraints" $pins
  unpinned=$(comm -23 <("$dir/venv/bin/pip" freeze | sort) <(grep -v '^#' "$constraints" | sort))
  if [[ -n $unpinned ]]; then
    echo "build-sdk-venv.sh: not pinned by $constraints: $unpinned" >&2
    exit 1
  fi
  echo "$key" >"$dir/.stamp"
  echo "build-sdk-venv.sh: installed in $(($(date +%s) - start))s ($(du -sh "$dir/venv" | cut -f1))" >&2
fi
echo "$dir/venv/bin/python"
