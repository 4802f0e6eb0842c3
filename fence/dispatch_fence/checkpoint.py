"""The checkpoint fence's public surface: publish a checkpoint directory so that
a late save from a superseded execution can never overwrite a newer one
(docs/checkpoint.md).

    from dispatch_fence import checkpoint
    # ... the framework writes its files into staging/, then the marker last:
    open(os.path.join(staging, checkpoint.MARKER), "w").close()
    checkpoint.publish(staging, "/ckpt")          # epoch and attempt from the environment
    ...
    found = checkpoint.latest("/ckpt")            # None before the first publish
    if found: restore(found.path)

Exit status of `python -m dispatch_fence` and `toolkit checkpoint`:
0 published (the path on stdout), 1 refused (a lower epoch), 2 bad input
(the epoch, the attempt, the staging directory, a root that cannot be
written or locked, a LATEST that is not ours). Every error is one line.

This module defines nothing: it names, in one place, what the layers below
define (docs/checkpoint.md, "The fence's modules"), so `checkpoint.X` stays
the one spelling for users while each name lives in one module:

    dispatch_fence.model   names, the rule (check_fence), validation, the errors, Checkpoint
    dispatch_fence.posix   a directory root (LOCK, STEPS: the publish's test-hook steps)
    dispatch_fence.roots   publish, latest, checkpoints: a directory or an s3:// or gs:// URL
    dispatch_fence.cli     main: `python -m dispatch_fence`

It sits on top of them and nothing of the fence imports it. Standard library
only: importing it loads those four modules and no object-store code (a URL
root loads dispatch_fence.objectstore when it is first used).
"""

from __future__ import annotations

import sys

from dispatch_fence import cli, model, posix, roots

# The names and the rule.
MARKER = model.MARKER
LATEST = model.LATEST
PREFIX = model.PREFIX
ENV_EPOCH = model.ENV_EPOCH
ENV_ATTEMPT = model.ENV_ATTEMPT
MAX_EPOCH = model.MAX_EPOCH
MAX_ATTEMPT_LEN = model.MAX_ATTEMPT_LEN
TEST_HOOK_FD = model.TEST_HOOK_FD
Checkpoint = model.Checkpoint
parse_epoch = model.parse_epoch
parse_attempt = model.parse_attempt
parse_keep = model.parse_keep
execution = model.execution
name_of = model.name_of
parse_name = model.parse_name
check_fence = model.check_fence
is_url = model.is_url
hook = model.hook

# The errors (each with its exit code).
CheckpointError = model.CheckpointError
BadInput = model.BadInput
UnwritableRoot = model.UnwritableRoot
CorruptRoot = model.CorruptRoot
StaleEpoch = model.StaleEpoch

# A directory root's own.
LOCK = posix.LOCK
STEPS = posix.STEPS

# Publishing and reading, a root of either kind.
publish = roots.publish
latest = roots.latest
checkpoints = roots.checkpoints

# The command line.
main = cli.main
one_line = cli.one_line

if __name__ == "__main__":
    sys.exit(main())
