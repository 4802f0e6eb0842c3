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

# shellcheck source=devcluster/cached-venv.sh
. "$(dirname "$0")/cached-venv.sh"
# shellcheck disable=SC2086 # the pins are words
cached_venv sdk "$pins $(sha256sum <"$constraints" | cut -c1-12)" "$constraints" $pins
