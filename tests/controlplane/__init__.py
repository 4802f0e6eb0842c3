"""The local Kubernetes control plane for the integration tests (see harness.py)."""
