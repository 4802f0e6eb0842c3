# Two commands a newcomer needs: `make demo` and `make test`. Every target
# installs what it needs, idempotently, and is quick when that is done.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: deps venv images controlplane controllers test faults faults-soak test-prologue test-python demo demo-prologue cluster-up cluster-down e2e bench clean

deps:
	sh scripts/install-host-packages.sh

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

venv: deps $(STAMP)

images: venv
	bash scripts/build-images.sh

controlplane: deps
	bash devcluster/build-controlplane.sh

controllers: deps
	bash devcluster/build-controllers.sh
	bash devcluster/build-controllers.sh services

e2e: venv images controlplane controllers
	$(VENV)/bin/pytest -p no:cacheprovider tests/e2e

test: venv images controlplane controllers
	bash scripts/run-tests.sh

# The fault suite alone (docs/e2e.md, "Faults"); `make test` runs it too.
faults: venv images controlplane controllers
	. scripts/podman-service.sh && $(VENV)/bin/pytest -p no:cacheprovider tests/faults

# The fault state machine (tests/faults/test_state_machine.py) with more and longer examples than
# `make faults` gives it; not part of `make test`.
faults-soak: venv images controlplane controllers
	. scripts/podman-service.sh && DISPATCH_FAULTS_EXAMPLES=20 DISPATCH_FAULTS_STEPS=10 \
	  $(VENV)/bin/pytest -p no:cacheprovider -o timeout=0 tests/faults/test_state_machine.py

test-prologue: venv images
	bash scripts/run-tests.sh prologue

test-python: venv images controlplane
	bash scripts/run-tests.sh python

# The whole system on the local cluster (devcluster/demo.py); it builds the cluster first (cached),
# with a line per build step.
demo: venv images
	$(PY) -m devcluster.demo

# The prologue alone, in the three local images.
demo-prologue: venv images
	bash scripts/demo.sh

cluster-up: venv images
	$(VENV)/bin/toolkit cluster up

cluster-down: venv
	$(VENV)/bin/toolkit cluster down

# Every bench under bench/, full runs (docs/benchmarks.md); `make test` runs each one's --smoke
# (tests/bench/test_bench_smoke.py).
bench: venv images controlplane
	$(PY) bench/prologue
	$(PY) bench/sidecar
	$(PY) bench/dispatcher --runs 300 --inflight 100
	$(PY) bench/controller
	$(PY) bench/admission
	$(PY) bench/checkpoint
	bash bench/wrap

clean:
	rm -rf $(VENV) build *.egg-info
