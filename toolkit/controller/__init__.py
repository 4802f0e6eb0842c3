"""The dispatch controller: the Kueue admission check that raises A before
every admission, and the reset detector that flags foreign TrainJobs.

Modules, in flow order (drawn in `app`): `informer` (list+watch) →
`queue` (keyed work queue) → `admission` (raise, then check Ready) and
`detector` (JobSet UID, pods, sidecar reports) → `health` (probes and
metrics). `app` wires them under leader election.
"""
