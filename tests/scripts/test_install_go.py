"""scripts/install-go.sh and scripts/go-path.sh: the Go the builds need, on a machine whose own Go is
older (Debian 12's is 1.19). A `go` on PATH that says it is older is this machine's real go behind a
shim that answers `go env GOVERSION` with an old version; every other call, the module download
included, is the real go's. The toolchain comes from the module proxy the go command is configured
with, as when it switches toolchains itself."""

from __future__ import annotations

import os
import pathlib
import shutil
import stat
import subprocess
import tempfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def go_path_values() -> dict[str, str]:
    """GO_MIN and GO_VERSION as go-path.sh sets them."""
    out = subprocess.run(["sh", "-c", f'. {REPO}/scripts/go-path.sh; echo "$GO_MIN $GO_VERSION"'],
                         capture_output=True, text=True, check=True).stdout.split()
    return {"GO_MIN": out[0], "GO_VERSION": out[1]}


def shim(directory: pathlib.Path, version: str) -> pathlib.Path:
    """A `go` that reports VERSION and hands every other call to the real go."""
    real = shutil.which("go")
    assert real, "go is not on PATH: make deps installs it"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "go"
    path.write_text(f'#!/bin/sh\nif [ "$*" = "env GOVERSION" ]; then echo {version}; exit 0; fi\nexec {real} "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return directory


@pytest.mark.parametrize(("version", "enough"), [
    ("go1.19.8", False), ("go1.25.9", False), ("go1.26.0", True), ("go1.26.8", True), ("go1.27rc1", True),
    ("go1.100.1", True), ("go2.0.0", True), ("go1.3", False),
])
def test_go_at_least_compares_versions_by_number(tmp_path: pathlib.Path, version: str, enough: bool) -> None:
    bin_dir = shim(tmp_path / "bin", version)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "DISPATCH_K8S_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(["sh", "-c", f". {REPO}/scripts/go-path.sh; go_at_least"], env=env, check=False)
    assert (done.returncode == 0) is enough


def test_an_older_go_fetches_the_toolchain_once_and_the_builds_then_find_it(tmp_path: pathlib.Path) -> None:
    versions = go_path_values()
    cache = tmp_path / "cache"
    env = {**os.environ, "PATH": f"{shim(tmp_path / 'old', 'go1.19.8')}:{os.environ['PATH']}",
           "DISPATCH_K8S_CACHE": str(cache)}
    first = subprocess.run(["sh", f"{REPO}/scripts/install-go.sh"], env=env, capture_output=True, text=True,
                           timeout=600, check=False)
    assert first.returncode == 0, first.stderr
    home = cache / f"go-{versions['GO_VERSION']}"
    assert f"fetching golang.org/toolchain@v0.0.1-go{versions['GO_VERSION']}.linux-" in first.stderr
    assert subprocess.run([home / "bin" / "go", "env", "GOVERSION"], capture_output=True, text=True,
                          check=True).stdout.strip() == f"go{versions['GO_VERSION']}"
    assert [p.name for p in cache.iterdir()] == [home.name]  # no partial tree, no module cache left

    again = subprocess.run(["sh", f"{REPO}/scripts/install-go.sh"], env=env, capture_output=True, text=True,
                           timeout=60, check=False)
    assert (again.returncode, again.stderr) == (0, "")

    # What a build script sees after sourcing go-path.sh: the fetched go first, and new enough.
    seen = subprocess.run(["sh", "-c", f". {REPO}/scripts/go-path.sh; command -v go; go_at_least && echo enough"],
                          env=env, capture_output=True, text=True, check=True).stdout.split()
    assert seen == [str(home / "bin" / "go"), "enough"]


def test_without_any_go_and_not_root_it_says_what_to_do() -> None:
    """No go at all: installing Debian's needs root; anyone else is told in one line. The scripts
    run as nobody from a copy that nobody can read (pytest's own temporary folders are root's)."""
    with tempfile.TemporaryDirectory() as scratch:
        root = pathlib.Path(scratch)
        root.chmod(0o755)
        (root / "scripts").mkdir()
        for name in ("install-go.sh", "go-path.sh"):
            shutil.copy(REPO / "scripts" / name, root / "scripts" / name)
        bin_dir = root / "bin"
        bin_dir.mkdir()
        for tool in ("sh", "dirname", "id", "uname", "mktemp", "sed", "cat", "rm", "chmod"):
            found = shutil.which(tool)
            assert found
            (bin_dir / tool).symlink_to(found)
        setpriv = shutil.which("setpriv")
        assert setpriv, "setpriv (util-linux) is not installed"
        done = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", str(bin_dir / "sh"),
                               str(root / "scripts" / "install-go.sh")],
                              env={"PATH": str(bin_dir), "HOME": str(root), "DISPATCH_K8S_CACHE": str(root / "c")},
                              capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert done.stderr == ("install-go.sh: no go on PATH; run as root to install Debian's golang-go, or put Go "
                           f"{go_path_values()['GO_MIN']} or later on PATH\n")
