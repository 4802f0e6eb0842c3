# Two commands a newcomer needs: `make demo` and `make test`. Every target
# installs what it needs, idempotently, and is quick when that is done.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: deps venv tools release release-bases release-bases-file release-registry release-images images controlplane controllers objectstores torch-venv sdk-venv test faults faults-soak test-prologue test-python demo demo-prologue cluster-up cluster-down e2e test-matrix bench clean

# The Debian packages, and a Go new enough for the Go modules the builds use (scripts/install-go.sh).
deps:
	sh scripts/install-host-packages.sh
	sh scripts/install-go.sh

# Three distributions, installed editable: the checkpoint fence (fence/: what training images
# install), the toolkit (the root pyproject.toml: the wheel users install; its `checkpoint` command
# imports the fence), and the development distribution (dev/pyproject.toml: the processes, the
# local cluster, the release, the reference backend and the test tools).
$(STAMP): pyproject.toml fence/pyproject.toml dev/pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q -c constraints.txt -e './fence[s3,gcs]'
	$(VENV)/bin/pip install -q -c constraints.txt -e '.[checkpoint]' -e './dev[test]'
	touch $@

venv: deps $(STAMP)

images: venv
	bash scripts/build-images.sh

# The release bundle (release/, docs/install.md): builds the controller, dispatcher, sidecar and
# test-driver images for linux/amd64 and linux/arm64, writes each as one OCI image index into the
# images archive and copies it from there to REGISTRY (skopeo, as logged in there with podman), and
# writes one install manifest per part and the Helm chart into OUT, every image as
# REGISTRY/dispatch/NAME:TAG@sha256:DIGEST (the index's), rendered with kustomize built from its
# module (no Kubernetes build). With BASES=FILE it needs no root: the bases come from FILE (which
# `make release-bases` wrote as root) and rootless podman builds on them in the user's own storage.
#   make release REGISTRY=HOST[:PORT][/PATH] [VERSION=0.1.0] [OUT=dist/release] [BASES=FILE]
OUT ?= dist/release
release: release-registry venv $(if $(BASES),,images) tools
	kustomize=$$($(PY) -c 'from devcluster import local; print(local.kustomize())'); \
	$(PY) -m release --registry '$(REGISTRY)' --kustomize "$$kustomize" --out '$(OUT)' $(if $(VERSION),--version '$(VERSION)') $(if $(BASES),--bases '$(BASES)')

# The bases the release's images are built on (`make images`, as root) written into one archive any
# user can read, for `make release BASES=FILE` without root (release/bases.py).
#   make release-bases BASES=FILE
release-bases: release-bases-file venv images
	$(PY) -m release.bases export '$(BASES)'

# Checked before anything is built.
release-bases-file:
	@test -n "$(BASES)" || { echo "make release-bases: BASES=FILE is required" >&2; exit 2; }

# Checked before anything is built.
release-registry:
	@test -n "$(REGISTRY)" || { echo "make release: REGISTRY=HOST[:PORT][/PATH] is required" >&2; exit 2; }

# This checkout's release images (controller, dispatcher, sidecar, test driver) built into local
# storage, kept while what they are built from is unchanged (devcluster/install.py); `make demo`,
# `toolkit cluster up` and the e2e tests push them to the local cluster's registry.
release-images: venv images
	$(PY) -m devcluster.install

controlplane: deps
	bash devcluster/build-controlplane.sh

# The Trainer, JobSet and Kueue controllers and the node's runtime, the cluster's services, and
# the tools, each built from its Go module (devcluster/build-controllers.sh).
controllers: deps tools
	bash devcluster/build-controllers.sh
	bash devcluster/build-controllers.sh services

# helm (tests/release/test_chart.py) and kustomize (what renders the release's manifests).
tools: deps
	bash devcluster/build-controllers.sh tools

# The S3 and GCS servers the checkpoint fence is tested and benched against (devcluster/objectstores.py).
objectstores: deps
	bash devcluster/build-object-stores.sh

# torch (the CUDA build the registry serves, run on CPU), Lightning and transformers for the fence's
# PyTorch DCP, Lightning and Hugging Face suites, in virtualenvs of their own in the user cache: the
# pinned versions and the lowest the fence's extras allow, each about 5.5 GB installed
# (devcluster/build-torch-venv.sh prints the size).
torch-venv: deps
	bash devcluster/build-torch-venv.sh
	bash devcluster/build-torch-venv.sh lowest

# The Kubeflow SDK (kubeflow, with the Trainer's API models and its own kubernetes client) for the
# tests that submit TrainJobs as an SDK user does, in a virtualenv of its own in the user cache, every
# version pinned by devcluster/sdk-constraints.txt (devcluster/build-sdk-venv.sh).
sdk-venv: deps
	bash devcluster/build-sdk-venv.sh

e2e: venv images release-images controlplane controllers sdk-venv
	$(VENV)/bin/pytest -p no:cacheprovider tests/e2e

# The install-and-admit test (tests/e2e/test_install_into_a_bare_cluster.py) on each version set of
# devcluster/versions.txt, the table docs/install.md's "Supported versions" gives: each set's JobSet
# and Kueue built into a cache directory of its own (devcluster/build-controllers.sh), its CRDs and
# webhooks read from those releases' modules. Stops at the first set that fails, naming it.
test-matrix: venv images release-images controlplane controllers
	$(PY) -m devcluster.versions | while read -r jobset kueue; do \
	  echo "make test-matrix: JobSet $$jobset, Kueue $$kueue" >&2; \
	  export DISPATCH_JOBSET_VERSION=$$jobset DISPATCH_KUEUE_VERSION=$$kueue; \
	  bash devcluster/build-controllers.sh </dev/null >/dev/null && \
	  $(VENV)/bin/pytest -p no:cacheprovider -q tests/e2e/test_install_into_a_bare_cluster.py </dev/null \
	  || { echo "make test-matrix: failed on JobSet $$jobset, Kueue $$kueue" >&2; exit 1; }; \
	done

test: venv images release-images controlplane controllers objectstores torch-venv sdk-venv
	bash scripts/run-tests.sh

# The fault suite alone (docs/e2e.md, "Faults"); `make test` runs it too.
faults: venv images controlplane controllers
	. scripts/podman-service.sh && $(VENV)/bin/pytest -p no:cacheprovider tests/faults

# The fault state machine (tests/faults/test_state_machine.py) with more and longer examples than
# `make faults` gives it, and no time budget; not part of `make test`.
faults-soak: venv images controlplane controllers
	. scripts/podman-service.sh && DISPATCH_FAULTS_BUDGET=0 DISPATCH_FAULTS_EXAMPLES=20 DISPATCH_FAULTS_STEPS=10 \
	  $(VENV)/bin/pytest -p no:cacheprovider -o timeout=0 tests/faults/test_state_machine.py

test-prologue: venv images
	bash scripts/run-tests.sh prologue

test-python: venv images controlplane objectstores torch-venv sdk-venv
	bash scripts/run-tests.sh python

# The whole system on the local cluster (devcluster/demo.py); it builds the cluster first (cached),
# with a line per build step, versitygw for the object store its fence stage serves among them, and
# the pinned torch virtualenv (devcluster/build-torch-venv.sh) its fence stage's trainer mounts.
demo: venv images release-images
	$(PY) -m devcluster.demo

# The prologue alone, in the three local images.
demo-prologue: venv images
	bash scripts/demo.sh

cluster-up: venv images release-images
	$(VENV)/bin/toolkit cluster up

cluster-down: venv
	$(VENV)/bin/toolkit cluster down

# Every bench under bench/, full runs (docs/benchmarks.md); `make test` runs each one's --smoke
# (tests/bench/test_bench_smoke.py).
bench: venv images release-images controlplane controllers objectstores
	$(PY) bench/prologue
	$(PY) bench/sidecar
	$(PY) bench/dispatcher --runs 300 --inflight 100
	$(PY) bench/controller
	$(PY) bench/admission
	$(PY) bench/checkpoint
	$(PY) bench/checkpoint-s3
	bash bench/wrap

clean:
	rm -rf $(VENV) build *.egg-info
