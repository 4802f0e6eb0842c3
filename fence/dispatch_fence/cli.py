"""`python -m dispatch_fence publish|latest` (and the `dispatch-fence` console
script): the fence's standard-library command line, for images without click.

The same commands, exit codes and lines as `toolkit checkpoint`: 0 published
(the path on stdout) or read, 1 refused (a lower epoch: StaleEpoch), 2 bad
input (the epoch, the attempt, the staging directory, a root that cannot be
written or locked, a LATEST that is not ours). Every error is one line on
stderr, prefixed with the command, never a traceback: the exit code is the
error's own (model.CheckpointError.exit_code).

A thin shell over dispatch_fence.roots: it parses, calls, prints. Only this
module exits; nothing of the fence imports it but the package's __main__.py
and the public surface (dispatch_fence.checkpoint, which names `main`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from dispatch_fence import model, roots


def main(argv: Sequence[str] | None = None, prog: str = "python -m dispatch_fence") -> int:
    """The standard-library CLI (images without click): same commands, exit codes and lines as `toolkit checkpoint`."""
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> None:  # type: ignore[override]
            print(f"{self.prog}: {message} (see '{self.prog} --help')", file=sys.stderr)
            sys.exit(2)

    parser = Parser(prog=prog, description="Publish checkpoints fenced by DISPATCH_EPOCH; read the latest.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    p = sub.add_parser("publish", help="publish STAGING into ROOT (a directory, s3://BUCKET/PREFIX or gs://BUCKET/PREFIX)")
    p.add_argument("staging")
    p.add_argument("root")
    p.add_argument("--keep", type=int, default=None, metavar="K", help="keep the newest K checkpoints")
    p.add_argument("--epoch", default=None, help=f"default ${model.ENV_EPOCH}")
    p.add_argument("--attempt", default=None, help=f"default ${model.ENV_ATTEMPT}")
    q = sub.add_parser("latest", help="print the path of ROOT's latest checkpoint (nothing if none)")
    q.add_argument("root")
    args = parser.parse_args(argv)
    where = f"{prog} {args.command}"
    try:
        if args.command == "publish":
            epoch, attempt = model.execution(args.epoch, args.attempt, cli=True)
            model.parse_keep(args.keep, "--keep")
            found = roots.publish(args.staging, args.root, epoch=epoch, attempt=attempt, keep=args.keep)
        else:
            found = roots.latest(args.root)
    except model.CheckpointError as exc:
        print(f"{where}: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    if found is not None:
        print(found.path)
    return 0


def one_line(text: str) -> str:
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())
