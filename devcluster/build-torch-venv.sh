#!/usr/bin/env bash
# Makes the virtualenv the checkpoint fence's PyTorch suite runs in
# (tests/checkpoint/test_dcp.py): torch from the registry, which on Linux
# x86_64 is the CUDA build with its nvidia-* packages (the suite runs it on CPU
# with gloo), numpy (DCP's collectives of Python objects need it), obstore for
# the s3:// roots, google-cloud-storage for the gs:// roots, Lightning
# (tests/checkpoint/test_lightning.py) and transformers with accelerate
# (tests/checkpoint/test_huggingface.py), every package they resolve to pinned
# by devcluster/torch-constraints.txt. Kept out of the project's .venv so
# `make venv` stays small, and cached in the user cache like the Go builds: the
# directory is named by a hash of the pins, the constraints and the
# interpreter, and a stamp written last marks it complete. A venv holding a
# package the constraints do not pin is refused. Each set is about 5.5 GB
# installed (the script prints the size when it installs).
#
# `build-torch-venv.sh lowest` makes the same venv at the lowest versions
# fence/pyproject.toml's extras allow, pinned by devcluster/torch-lowest-constraints.txt, for the
# suites that run the fence's integrations at both ends of their ranges.
#
# Prints the venv's python on stdout as its last line; progress goes to stderr.
# Env: DISPATCH_K8S_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/dispatch-k8s).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
case ${1:-pinned} in
  pinned)
    pins='torch==2.15.0 numpy==2.4.6 obstore==0.12.1 google-cloud-storage==3.17.1 lightning==2.6.6 transformers==5.25.0 accelerate==1.16.0'
    constraints=$here/torch-constraints.txt ;;
  lowest)
    pins='torch==2.4.0 numpy==1.26.4 obstore==0.7.0 google-cloud-storage==3.0.0 lightning==2.4.0 transformers==4.46.1 accelerate==1.0.0'
    constraints=$here/torch-lowest-constraints.txt ;;
  *)
    echo "build-torch-venv.sh: the set is pinned or lowest, not $1" >&2
    exit 2 ;;
esac

# shellcheck source=devcluster/cached-venv.sh
. "$(dirname "$0")/cached-venv.sh"
# shellcheck disable=SC2086 # the pins are words
cached_venv torch "$pins $(sha256sum <"$constraints" | cut -c1-12)" "$constraints" $pins
