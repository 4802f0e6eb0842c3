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
# package the constraints do not pin is refused.
#
# Prints the venv's python on stdout as its last line; progress goes to stderr.
# Env: DISPATCH_K8S_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/dispatch-k8s).
set -euo pipefail

pins='torch==2.15.0 numpy==2.4.6 obstore==0.12.1 google-cloud-storage==3.17.1 lightning==2.6.6 transformers==5.25.0 accelerate==1.16.0'
constraints=$(cd "$(dirname "$0")" && pwd)/torch-constraints.txt

# shellcheck source=devcluster/cached-venv.sh
. "$(dirname "$0")/cached-venv.sh"
# shellcheck disable=SC2086 # the pins are words
cached_venv torch "$pins $(sha256sum <"$constraints" | cut -c1-12)" "$constraints" $pins
