"""Tests that prove the control plane is real: they fail against a mock."""
