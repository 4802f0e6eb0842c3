"""KUBEBUILDER_ASSETS (the envtest convention): a binary found there is used
before the cache's, binary by binary, and build.sh builds only what the assets
lack. The assets here are symlinks to the cached binaries, so nothing is
rebuilt but etcd, once, in the last test (seconds, with the Go build cache
that built the control plane).
"""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

from devcluster import harness

pytestmark = pytest.mark.cluster

BUILD_SH = harness.HERE / "build-controlplane.sh"
KUBE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kubelet", "kube-proxy")


def build_sh(*, assets: pathlib.Path | None, cache: pathlib.Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBEBUILDER_ASSETS", "DISPATCH_K8S_CACHE")}
    if assets is not None:
        env["KUBEBUILDER_ASSETS"] = str(assets)
    if cache is not None:
        env["DISPATCH_K8S_CACHE"] = str(cache)
    return subprocess.run(["bash", str(BUILD_SH)], env=env, capture_output=True, text=True, check=True,
                          timeout=600)


@pytest.fixture(scope="module")
def cached() -> pathlib.Path:
    """The cache's bin dir (make test builds it first: a no-op here)."""
    return pathlib.Path(build_sh(assets=None).stdout.splitlines()[-1])


def assets_dir(directory: pathlib.Path, cached: pathlib.Path, names: tuple[str, ...]) -> pathlib.Path:
    directory.mkdir()
    for name in names:
        (directory / name).symlink_to(cached / name)
    return directory


def test_the_harness_takes_each_binary_from_the_assets_first(
        cached: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What setup-envtest ships: etcd, kube-apiserver and kubectl; and a scheduler that cannot run.
    assets = assets_dir(tmp_path / "assets", cached, ("etcd", "kube-apiserver", "kubectl"))
    (assets / "kube-scheduler").write_text("#!/bin/sh\n")
    (assets / "kube-scheduler").chmod(0o644)
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets))
    assert harness.binary("etcd", cached) == assets / "etcd"
    assert harness.binary("kube-apiserver", cached) == assets / "kube-apiserver"
    assert harness.binary("kube-controller-manager", cached) == cached / "kube-controller-manager"
    assert harness.binary("kube-scheduler", cached) == cached / "kube-scheduler"
    assert harness.binary("kubectl", cached) == assets / "kubectl"
    version = subprocess.run([str(harness.binary("etcd", cached)), "--version"], capture_output=True, text=True,
                             check=True, timeout=30)
    assert "etcd Version: 3." in version.stdout
    with pytest.raises(harness.HarnessError, match="kube-controller-manager not found in"):
        harness.binary("kube-controller-manager", tmp_path)


def test_build_sh_builds_nothing_when_the_assets_hold_all_seven(cached: pathlib.Path, tmp_path: pathlib.Path) -> None:
    assets = assets_dir(tmp_path / "assets", cached, ("etcd", *KUBE))
    done = build_sh(assets=assets, cache=tmp_path / "cache")
    assert done.stdout.splitlines()[-1] == str(assets)
    assert not (tmp_path / "cache").exists()


def test_build_sh_builds_only_what_the_assets_lack(cached: pathlib.Path, tmp_path: pathlib.Path) -> None:
    assets = assets_dir(tmp_path / "assets", cached, KUBE)
    first = build_sh(assets=assets, cache=tmp_path / "cache")
    bin_dir = pathlib.Path(first.stdout.splitlines()[-1])
    assert bin_dir.is_relative_to(tmp_path / "cache")
    assert sorted(p.name for p in bin_dir.iterdir()) == [".stamp", "etcd"]
    assert "building etcd (" in first.stderr
    built = (bin_dir / "etcd").stat().st_mtime_ns
    again = build_sh(assets=assets, cache=tmp_path / "cache")
    assert again.stdout.splitlines()[-1] == str(bin_dir)
    assert "cached" in again.stderr
    assert (bin_dir / "etcd").stat().st_mtime_ns == built
