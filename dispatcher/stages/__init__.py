"""The dispatcher's stages, in the order `dispatcher.app` draws them.

- `claim`: the claim pipeline (how many claims may be in flight) and a
  claim's answer (reserve the slot, hand the run to the create);
- `create`: the Job, then its Secret (on the pool), and what its `Created`
  result does to the ledger (on the loop);
- `check`: a Job's Secret checked once (a tombstone when it has none) and
  the start deadline over the Pending driver pods;
- `report`: the deaths the driver could not report, one typed task per kind;
- `reap`: a dead run's sandbox pods, batched.

A stage's I/O runs on the worker pool and its answer comes back to the loop
through the inbox; only the loop changes the state (`app.Dispatcher`: the
ledger, the task tables, the one token record). No stage is given the
loop: each module names what it uses, an `IO` for the pool (clients and
settings, frozen) and a `State` for the loop (the parts of the state it
changes), and `dispatcher.app` builds them once and draws the flow. The
retried steps (checks, reports, reaps) are `task.Task`s: each kind a small
class with its own `step` (on the pool, given its `IO`) and `done` (on the
loop, given its `State`).
"""
