"""The adapter operations (docs/toolkit.md, docs/adapter.md): start, open, release, hold,
status, executions and adopt, plus the raise, the foreign flag and the
execution record the controller shares.

Each operation is a small function over a `kube.Client`; the rules it
applies are pure and live elsewhere (`raising` for the raise, `detect` for
resets, `history` for the execution history, `render` for the TrainJob,
`runtime_check` for the runtime requirements, `identity` for the epoch). The
CLI (`toolkit.cli_cluster`) and the controller are shells around these.

The parts, one job each (each module's docstring keeps its invariants):
- `trainjobs`: reading the TrainJob and its JobSet, writing our annotations
  within the byte budget, and the refusal a user reads (`AdapterError`);
- `raises`: the writes of A: `start` at A = 0, then `raise_admission`, the
  only write that changes A; the runtime check both rely on;
- `generations`: the counter that gives a TrainJob made without a StartRequest
  its generation (`toolkit.derive`);
- `holds`: `open_`, `release` and `hold`, in plain mode and in Kueue mode;
- `records`: what the adapter and the controller both record: the foreign
  flag, the JobSet UID and the execution history;
- `reports`: what `toolkit status` and `toolkit executions` show;
- `adoption`: `adopt`, a person's decision after a foreign flag.

This module is the adapter's surface for its callers (the CLI, the
controller, the local cluster, the benchmarks, the tests, and the library
examples in docs/adapter.md): `adapter.open_(client, ...)`. It holds no
code, only the parts' public names, bound here from the module that defines
each. A deliberate exception to importing modules, not names: every caller
reaches an operation in one place. The parts import each other's modules,
never this one.
"""

from __future__ import annotations

from toolkit import flagmark
from toolkit.adapter import adoption, generations, holds, raises, records, reports, trainjobs

# Reading and writing a TrainJob; the refusals.
COMPONENT = trainjobs.COMPONENT
AdapterError = trainjobs.AdapterError
AnnotationsRefused = trainjobs.AnnotationsRefused
restarts_of = trainjobs.restarts_of

# The writes of A.
RAISED_FOR_ANNOTATION = raises.RAISED_FOR_ANNOTATION
ALLOW_RANK_RESTART_ANNOTATION = raises.ALLOW_RANK_RESTART_ANNOTATION
Raised = raises.Raised
raise_admission = raises.raise_admission
Started = raises.Started
check_runtime = raises.check_runtime
start = raises.start
# The generation counter of TrainJobs made without a StartRequest.
claim_generation = generations.claim
identity_giver = generations.giver

# Open, release, hold.
is_kueue_mode = holds.is_kueue_mode
workloads_of = holds.workloads_of
is_active = holds.is_active
open_ = holds.open_
live_pods = holds.live_pods
release = holds.release
Held = holds.Held
holding = holds.holding
hold = holds.hold

# The records shared with the controller.
is_flagged = flagmark.is_flagged
flag_foreign = records.flag_foreign
check_jobset = records.check_jobset
record_jobset_uid = records.record_jobset_uid
record_execution = records.record_execution

# Status and executions.
HELD = reports.HELD
Status = reports.Status
compute_status = reports.compute_status
status = reports.status
is_flagged_with = reports.is_flagged_with
Executions = reports.Executions
executions = reports.executions

# Adopt.
CHECK_CONTROLLER_NAME = adoption.CHECK_CONTROLLER_NAME
ADOPTED_REASON = adoption.ADOPTED_REASON
Adopted = adoption.Adopted
adopt = adoption.adopt
