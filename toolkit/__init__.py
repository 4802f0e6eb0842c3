"""dispatch toolkit: execution identity for Kubeflow TrainJobs.

Layers, lowest first: the standard-library core the controller, dispatcher
and sidecar share; the pure identity domain and, beside it, the one
Kubernetes client; the operations, where the two meet; the `toolkit` CLI on
top. A module imports only its own layer and the ones below it, never one
above or beside it (the domain and the client). The table is written
once, in docs/architecture.md, and held by tests/lint/test_layers.py.

The long-running processes are packages beside this one, built on it:
controller/, dispatcher/ and sidecar/; the toolkit imports none of them
(`toolkit controller` is the controller's own command, loaded by its entry
point).
"""
