# shellcheck shell=bash
# Sourced by devcluster/build-torch-venv.sh and devcluster/build-sdk-venv.sh: a
# virtualenv of its own in the user cache, for a tool whose dependencies must
# not meet the project's .venv. The directory is named by a hash of KEY and the
# interpreter's version; a stamp holding KEY, written last, marks it complete,
# so a run that finds it is quick and one killed halfway starts over. With a
# CONSTRAINTS file, pip installs under it and a venv holding a package it does
# not pin is refused: every version in it is the file's own.
#
# cached_venv NAME KEY CONSTRAINTS PIN...: prints the venv's python on stdout;
# progress goes to stderr. CONSTRAINTS may be empty.
# Env: DISPATCH_K8S_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/dispatch-k8s).
cached_venv() {
  local name=$1 key=$2 constraints=$3
  shift 3
  local script=build-$name-venv.sh cache_root python version dir start unpinned
  cache_root=${DISPATCH_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dispatch-k8s}
  python=$(command -v python3)
  version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  dir=$cache_root/$name-venv-$(printf '%s %s' "$key" "$version" | sha256sum | cut -c1-12)
  mkdir -p "$dir"
  exec 9>"$dir/.lock"
  flock 9
  if [[ -f $dir/.stamp && $(cat "$dir/.stamp") == "$key" ]]; then
    echo "$script: cached: $*" >&2
  else
    echo "$script: installing $* (python $version)" >&2
    start=$(date +%s)
    rm -rf "$dir/venv"
    "$python" -m venv "$dir/venv"
    "$dir/venv/bin/pip" install -q ${constraints:+-c "$constraints"} "$@"
    if [[ -n $constraints ]]; then
      unpinned=$(comm -23 <("$dir/venv/bin/pip" freeze | sort) <(grep -v '^#' "$constraints" | sort))
      if [[ -n $unpinned ]]; then
        echo "$script: not pinned by $constraints: $unpinned" >&2
        return 1
      fi
    fi
    echo "$key" >"$dir/.stamp"
    echo "$script: installed in $(($(date +%s) - start))s ($(du -sh "$dir/venv" | cut -f1))" >&2
  fi
  echo "$dir/venv/bin/python"
}
