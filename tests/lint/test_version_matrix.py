"""The supported versions are the tested ones: docs/install.md's "Supported versions" table names
exactly the version sets of devcluster/versions.txt, the table `make test-matrix` runs the
install-and-admit test on and devcluster/build-controllers.sh builds from.

And the set is a parameter that refuses what the table does not name: devcluster/versions.py (a
refusal is one line naming the variable and the versions it may take) and build-controllers.sh
(the same line, exit 2, before anything is built); the local cluster's CRDs and controllers follow
the set the environment picks.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from devcluster import versions

ROOT = pathlib.Path(__file__).resolve().parents[2]
INSTALL = ROOT / "docs" / "install.md"
SECTION = "## Supported versions"
HEADER = ("Kubernetes", "Kubeflow Trainer", "JobSet", "Kueue")


def docs_rows(text: str) -> list[versions.Row]:
    """The rows of the first table under SECTION, as (Kubernetes, Trainer, JobSet, Kueue)."""
    assert SECTION + "\n" in text, f"no section {SECTION!r}"
    lines = text.split(SECTION + "\n", 1)[1].split("\n## ", 1)[0].splitlines()
    table = [line for line in lines if line.startswith("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table]
    assert tuple(cells[0]) == HEADER, f"the table's header is {cells[0]}, want {HEADER}"
    return [versions.Row(*row) for row in cells[2:]]


def test_the_docs_table_names_exactly_the_version_sets_the_matrix_builds() -> None:
    assert docs_rows(INSTALL.read_text()) == list(versions.MATRIX)


def test_the_docs_table_is_read_row_by_row() -> None:
    text = (f"{SECTION}\n\n| {' | '.join(HEADER)} |\n|---|---|---|---|\n| v1.0.0 | v2.0.0 | v0.1.0 | v0.2.0 |\n\n"
            "## Next\n\n| a |\n")
    assert docs_rows(text) == [versions.Row("v1.0.0", "v2.0.0", "v0.1.0", "v0.2.0")]


TABLE = "# kubernetes trainer jobset kueue\nv1.37.2 v2.3.0 v0.12.0 v0.19.2\n\nv1.37.2 v2.3.0 v0.11.1 v0.18.3  # low\n"


def test_the_first_row_is_the_default_and_an_empty_variable_is_unset() -> None:
    rows = versions.parse(TABLE)
    assert versions.choose(rows, {}) == rows[0]
    assert versions.choose(rows, {versions.KUEUE_ENV: "", versions.JOBSET_ENV: ""}) == rows[0]
    assert versions.choose(rows, {versions.KUEUE_ENV: "v0.18.3", versions.JOBSET_ENV: "v0.11.1"}) == rows[1]
    assert versions.choose(rows, {versions.KUEUE_ENV: "v0.18.3"}) == versions.Row(
        "v1.37.2", "v2.3.0", "v0.12.0", "v0.18.3")


@pytest.mark.parametrize(("env", "message"), [
    ({versions.KUEUE_ENV: "v0.17.0"},
     "DISPATCH_KUEUE_VERSION=v0.17.0: not a tested kueue version (devcluster/versions.txt has v0.19.2, v0.18.3)"),
    ({versions.JOBSET_ENV: "0.11.1"},
     "DISPATCH_JOBSET_VERSION=0.11.1: not a tested jobset version (devcluster/versions.txt has v0.12.0, v0.11.1)"),
])
def test_a_version_the_table_does_not_name_is_refused_in_one_line(env: dict[str, str], message: str) -> None:
    with pytest.raises(versions.VersionError) as refused:
        versions.choose(versions.parse(TABLE), env)
    assert str(refused.value) == message


@pytest.mark.parametrize(("text", "message"), [
    ("v1.37.2 v2.3.0 v0.12.0\n",
     "versions.txt line 1: want kubernetes trainer jobset kueue as vX.Y.Z each, got 'v1.37.2 v2.3.0 v0.12.0'"),
    ("# only a comment\n", "versions.txt: no version set"),
    ("v1.37.2 v2.3.0 v0.12.0 v0.19.2\nv1.36.0 v2.3.0 v0.12.0 v0.19.2\n",
     "versions.txt: kubernetes differs between rows; only jobset and kueue vary"),
])
def test_a_table_that_is_not_four_versions_a_row_is_refused(text: str, message: str) -> None:
    with pytest.raises(versions.VersionError) as refused:
        versions.parse(text)
    assert str(refused.value) == message


def test_the_build_refuses_a_version_the_table_does_not_name_before_building() -> None:
    proc = subprocess.run(["bash", str(ROOT / "devcluster" / "build-controllers.sh")], capture_output=True, text=True,
                          env={**os.environ, versions.KUEUE_ENV: "v0.17.0",
                               "DISPATCH_K8S_CACHE": "/nonexistent/never-made"}, check=False)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == ("build-controllers.sh: DISPATCH_KUEUE_VERSION=v0.17.0: not a tested kueue version "
                           "(devcluster/versions.txt has v0.19.2, v0.18.3)\n")


def test_the_local_clusters_crds_and_controllers_follow_the_picked_set() -> None:
    low = versions.MATRIX[-1]
    code = ("from devcluster import harness, stack; "
            "print(*[v for _, v, _ in harness.CRD_SOURCES], stack.TRAINER[1], stack.JOBSET[1], stack.KUEUE[1])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, versions.JOBSET_ENV: low.jobset, versions.KUEUE_ENV: low.kueue}).stdout
    assert out.split() == [low.trainer, low.jobset, low.kueue, low.trainer, low.jobset, low.kueue]
