"""The version sets the local cluster runs: the table in devcluster/versions.txt, and the set the
environment picks from it.

Why a table: the versions the docs call supported are the ones `make test-matrix` ran, and both
read this one file (as does devcluster/build-controllers.sh, which builds each set's Kueue and
JobSet into a cache directory of its own). The first row is the default: with neither variable set
the cluster, its CRDs and its cache directory are the default set's.

Invariant: a picked version is one the table names in its column; anything else is refused with a
one-line `VersionError` naming the variable and the versions it may take, before anything is built
or started. Kubernetes and Trainer are the same in every row (the control plane and Trainer are not
parameters); a table where they differ is refused too.

Pure: reads the table's text and the mapping it is given, nothing else.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import sys
from collections.abc import Mapping

TABLE = pathlib.Path(__file__).resolve().parent / "versions.txt"
JOBSET_ENV = "DISPATCH_JOBSET_VERSION"
KUEUE_ENV = "DISPATCH_KUEUE_VERSION"
_VERSION = re.compile(r"v\d+\.\d+\.\d+")
COLUMNS = ("kubernetes", "trainer", "jobset", "kueue")


class VersionError(ValueError):
    """A version the table does not name, or a table that cannot be read."""


@dataclasses.dataclass(frozen=True)
class Row:
    kubernetes: str
    trainer: str
    jobset: str
    kueue: str


def parse(text: str) -> tuple[Row, ...]:
    """The rows of a table's TEXT: four versions a line, `#` comments and blank lines skipped."""
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) != len(COLUMNS) or not all(_VERSION.fullmatch(f) for f in fields):
            raise VersionError(f"versions.txt line {number}: want {' '.join(COLUMNS)} as vX.Y.Z each, "
                               f"got {line.strip()!r}")
        rows.append(Row(*fields))
    if not rows:
        raise VersionError("versions.txt: no version set")
    for column in ("kubernetes", "trainer"):
        if len({getattr(r, column) for r in rows}) != 1:
            raise VersionError(f"versions.txt: {column} differs between rows; only jobset and kueue vary")
    return tuple(rows)


def choose(rows: tuple[Row, ...], environ: Mapping[str, str]) -> Row:
    """The set ENVIRON picks: JOBSET_ENV and KUEUE_ENV, each the default row's when unset or empty."""
    default = rows[0]
    picked = {}
    for column, env in (("jobset", JOBSET_ENV), ("kueue", KUEUE_ENV)):
        allowed = list(dict.fromkeys(getattr(r, column) for r in rows))
        value = environ.get(env) or getattr(default, column)
        if value not in allowed:
            raise VersionError(f"{env}={value}: not a tested {column} version (devcluster/versions.txt has "
                               f"{', '.join(allowed)})")
        picked[column] = value
    return dataclasses.replace(default, **picked)


MATRIX = parse(TABLE.read_text())
DEFAULT = MATRIX[0]


def selected() -> Row:
    """The set this process's environment picks."""
    return choose(MATRIX, os.environ)


if __name__ == "__main__":  # `python -m devcluster.versions`: each row's jobset and kueue, for make
    print("\n".join(f"{r.jobset} {r.kueue}" for r in MATRIX))
    sys.exit(0)
