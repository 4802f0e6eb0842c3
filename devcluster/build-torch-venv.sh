#!/usr/bin/env bash
# Makes the virtualenv the checkpoint fence's PyTorch suite runs in
# (tests/checkpoint/test_dcp.py): torch from the registry, which on Linux
# x86_64 is the CUDA build with its nvidia-* packages (the suite runs it on CPU
# with gloo), numpy (DCP's collectives of Python objects need it), obstore for
# the s3:// roots, google-cloud-storage for the gs:// roots, and Lightning
# (tests/checkpoint/test_lightning.py). Kept out of the project's .venv so `make venv` stays
# small, and cached in the user cache like the Go builds: the directory is
# named by a hash of the pins and the interpreter, and a stamp written last
# marks it complete. On a new machine: 2.8 GB to download, 5.4 GB installed.
#
# Prints the venv's python on stdout as its last line; progress goes to stderr.
# Env: DISPATCH_K8S_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/dispatch-k8s).
set -euo pipefail

pins='torch==2.15.0 numpy==2.4.6 obstore==0.12.1 google-cloud-storage==3.17.1 lightning==2.6.6'

cache_root=${DISPATCH_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dispatch-k8s}
python=$(command -v python3)
version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
dir=$cache_root/torch-venv-$(printf '%s %s' "$pins" "$version" | sha256sum | cut -c1-12)
mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9
if [[ -f $dir/.stamp && $(cat "$dir/.stamp") == "$pins" ]]; then
  echo "build-torch-venv.sh: cached: $pins" >&2
else
  echo "build-torch-venv.sh: installing $pins (python $version)" >&2
  start=$(date +%s)
  rm -rf "$dir/venv"
  "$python" -m venv "$dir/venv"
  # shellcheck disable=SC2086 # the pins are words
  "$dir/venv/bin/pip" install -q $pins
  echo "$pins" >"$dir/.stamp"
  echo "build-torch-venv.sh: installed in $(($(date +%s) - start))s ($(du -sh "$dir/venv" | cut -f1))" >&2
fi
echo "$dir/venv/bin/python"
