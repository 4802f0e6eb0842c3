"""The dispatch controller: the Kueue admission check that raises A before
every admission, and the reset detector that flags foreign TrainJobs.

A long-running process like its siblings sidecar/ and dispatcher/, on the
library in toolkit/ (identity, the raise, the adapter operations, the one
Kubernetes client, and the standard-library core the three share).
`toolkit controller` and `python -m controller` start it.

Modules, in flow order (drawn in `app`): `toolkit.informer` (list+watch) →
`queue` (keyed work queue) → `admission` (raise, then check Ready) and
`detector` (JobSet UID, pods, sidecar reports) → `health` (probes and
metrics). `app` wires them under leader election.
"""
