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

# shellcheck source=devcluster/cached-venv.sh
. "$(dirname "$0")/cached-venv.sh"
# shellcheck disable=SC2086 # the pins are words
cached_venv torch "$pins" "" $pins
