"""The project's tests; a package so that `python -m tests.controlplane.harness` works."""
