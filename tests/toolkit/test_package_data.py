"""The wheel users install (the root pyproject.toml) is the toolkit alone: the
`toolkit` package with the prologue as a real file (toolkit/data/prologue.sh is
a committed symlink to prologue/prologue.sh), its three commands, and the
dependencies the toolkit imports. The controller, the dispatcher and the
sidecar run from their images; the local cluster, the release and the reference
backend stay in the repository (dev/pyproject.toml). Installed into a fresh
venv outside the repository, with pip resolving its dependencies as a user's
pip does, `toolkit --help`, `toolkit wrap` and `toolkit render runtime` work."""

from __future__ import annotations

import email.parser
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

REPO = pathlib.Path(__file__).parents[2]
RUNTIME = (
    "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: ClusterTrainingRuntime\nmetadata: {name: r}\n"
    "spec:\n  template:\n    spec:\n      replicatedJobs:\n      - name: node\n        template:\n"
    "          metadata: {labels: {trainer.kubeflow.org/trainjob-ancestor-step: trainer}}\n"
    "          spec:\n            template:\n              spec:\n                containers: [{name: node, image: i}]\n"
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    # Built from a copy of what the root pyproject.toml reads: setuptools builds in the tree it is
    # given, and a checkout's build/ may hold what an older layout put there.
    out, source = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "toolkit", source / "toolkit", ignore=shutil.ignore_patterns("__pycache__", "release.json"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                            "-w", str(out), str(source)], cwd=out, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    (found,) = out.glob("*.whl")
    return found


def test_symlink_points_at_the_one_copy() -> None:
    link = REPO / "toolkit" / "data" / "prologue.sh"
    assert link.is_symlink() and os.readlink(link) == "../../prologue/prologue.sh"


def test_wheel_carries_the_prologue_bytes(wheel: pathlib.Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        info = z.getinfo("toolkit/data/prologue.sh")
        assert (info.external_attr >> 16) & 0o170000 == 0o100000, "a regular file, not a symlink"
        assert z.read(info) == (REPO / "prologue" / "prologue.sh").read_bytes()


def test_the_wheel_is_the_toolkit_alone(wheel: pathlib.Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = email.parser.Parser().parsestr(z.read("dispatch_k8s-0.1.0.dist-info/METADATA").decode())
        entry_points = z.read("dispatch_k8s-0.1.0.dist-info/entry_points.txt").decode()
    assert {name.split("/")[0] for name in names} == {"toolkit", "dispatch_k8s-0.1.0.dist-info"}
    shipped = {name for name in names if name.startswith("toolkit/") and name.endswith(".py")}
    assert shipped == {str(p.relative_to(REPO)) for p in (REPO / "toolkit").rglob("*.py")}
    requires = sorted(re.split(r"[<>=!~ ;]", r, maxsplit=1)[0] for r in meta.get_all("Requires-Dist"))
    assert requires == ["PyYAML", "click", "dispatch-fence[gcs,s3]", "docker", "kubernetes", "urllib3"]
    assert meta.get_all("Provides-Extra") == ["checkpoint"]
    assert entry_points.split() == [
        "[console_scripts]", "kubectl-dispatch", "=", "toolkit.cli:kubectl_plugin",
        "kubectl_complete-dispatch", "=", "toolkit.cli_completion:kubectl_complete", "toolkit", "=", "toolkit.cli:main"]


def test_installed_alone_its_commands_work(wheel: pathlib.Path, tmp_path: pathlib.Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "-c", str(REPO / "constraints.txt"), str(wheel)],
                               cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}

    def toolkit(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(venv / "bin" / "toolkit"), *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)

    shown = toolkit("--help")
    assert shown.returncode == 0, shown.stderr
    listed = [line.split()[0] for line in shown.stdout.split("Commands:")[1].splitlines() if line.strip()]
    assert {"wrap", "render", "check-runtime", "start", "status", "adopt"} <= set(listed)
    assert "controller" not in listed and "cluster" not in listed  # those come with a checkout, not the wheel

    wrapped = toolkit("wrap", "--", "python", "train.py")
    assert (wrapped.returncode, wrapped.stderr) == (0, "")
    argv = json.loads(wrapped.stdout)
    assert argv[:2] == ["/bin/sh", "-c"] and argv[-3:] == ["dispatch-prologue", "python", "train.py"]

    (tmp_path / "rt.yaml").write_text(RUNTIME)
    rendered = toolkit("render", "runtime", "rt.yaml", "--output-file", "out.yaml", "--sidecar-image", "s:1")
    assert (rendered.returncode, rendered.stderr) == (0, "")
    checked = toolkit("check-runtime", "out.yaml")
    assert (checked.returncode, checked.stdout, checked.stderr) == (0, "out.yaml: ClusterTrainingRuntime/r: ok\n", "")
    # Nothing of the repository was imported: the toolkit the venv runs is the wheel's.
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import toolkit; print(toolkit.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=True)
    assert where.stdout.startswith(str(venv))
