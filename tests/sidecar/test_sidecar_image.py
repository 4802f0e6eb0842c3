"""The sidecar image, built with podman and run as a container: non-root,
read-only root filesystem, against the real apiserver (host network), and
stopped with SIGTERM (exit 0).

No registry is reachable, so the Python base is made here: the debootstrap
Debian base (scripts/build-images.sh) plus Debian's own python3.11 packages,
fetched with `apt-get download` and installed with dpkg in the build (the
build has no network). Only the packages the standard-library modules the
sidecar imports need; dpkg's dependency check is waived for the rest.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import uuid

import pytest

from tests.controlplane import harness
from tests.sidecar import test_sidecar_cluster as cluster
from toolkit import names

pytestmark = [pytest.mark.images, pytest.mark.cluster]

REPO = pathlib.Path(__file__).resolve().parents[2]
PYTHON_BASE = "localhost/dispatch-base/python:3.11-bookworm"
IMAGE = "localhost/dispatch/sidecar:test"
setup = cluster.setup  # the fixture: the shipped RBAC and a dispatch-sidecar token
ENV = {**os.environ, "CONTAINERS_CONF": str(REPO / "scripts/containers.conf")}


def podman(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], env=ENV, check=True, capture_output=True, text=True,
                          **kwargs)  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    podman("image", "exists", PYTHON_BASE)  # made by scripts/build-images.sh (make images)
    context = tmp_path_factory.mktemp("sidecar-context")
    (context / "toolkit").mkdir()
    for name in ("__init__.py", "names.py", "detect.py"):
        shutil.copy(REPO / "toolkit" / name, context / "toolkit" / name)
    shutil.copytree(REPO / "sidecar", context / "sidecar", ignore=shutil.ignore_patterns("__pycache__"))
    podman("build", "--isolation", "chroot", "-q", "--build-arg", f"BASE={PYTHON_BASE}", "-t", IMAGE,
           "-f", str(REPO / "images/sidecar.Containerfile"), str(context))
    return IMAGE


def test_image_is_non_root_and_small(image: str) -> None:
    inspected = json.loads(podman("image", "inspect", image).stdout)[0]
    assert inspected["Config"]["User"] == "65532:65532"
    size_mb = inspected["Size"] / 1e6
    print(f"sidecar image: {size_mb:.1f} MB")
    assert size_mb < 200


def test_runs_read_only_against_the_apiserver_and_stops_on_sigterm(
        image: str, setup: cluster.Setup, control_plane: harness.ControlPlane | harness.ExistingCluster,
        tmp_path: pathlib.Path) -> None:
    name = f"tj-{uuid.uuid4().hex[:6]}"
    setup.custom.create_namespaced_custom_object(*cluster.TRAINER, setup.namespace, "trainjobs", cluster.trainjob(
        name, annotations={names.FLOOR_ANNOTATION: "3", names.JOBSET_UID_ANNOTATION: cluster.RECORDED}))
    podinfo = cluster.write_podinfo(tmp_path / "podinfo", pod=f"{name}-node-0-0-x", namespace=setup.namespace,
                                    labels={names.JOBSET_NAME_LABEL: name, names.RESTART_LABEL: "0",
                                            names.JOBSET_UID_LABEL: cluster.RECORDED},
                                    annotations={names.ADMISSION_ANNOTATION: "2"})
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    shutil.copy(setup.env["DISPATCH_SIDECAR_TOKEN_FILE"], secrets / "token")
    shutil.copy(setup.env["DISPATCH_SIDECAR_CA_FILE"], secrets / "ca.crt")
    for path in (*podinfo.iterdir(), *secrets.iterdir()):
        path.chmod(0o644)
    for directory in (tmp_path, podinfo, secrets):
        directory.chmod(0o755)
    container = f"sidecar-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        ["podman", "run", "--rm", "--name", container, "--read-only", "--network", "host",
         "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
         "-v", f"{podinfo}:/etc/dispatch/podinfo:ro", "-v", f"{secrets}:/secrets:ro",
         "-e", f"DISPATCH_SIDECAR_API_SERVER={setup.env['DISPATCH_SIDECAR_API_SERVER']}",
         "-e", "DISPATCH_SIDECAR_TOKEN_FILE=/secrets/token", "-e", "DISPATCH_SIDECAR_CA_FILE=/secrets/ca.crt",
         "-e", "DISPATCH_SIDECAR_INTERVAL_SECONDS=0.2", image],
        env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sidecar = cluster.Sidecar.__new__(cluster.Sidecar)
    sidecar.lines, sidecar.proc = [], proc
    try:
        verdicts = sidecar.wait_for("verdict", count=2, timeout=60)
        assert [v["verdict"] for v in verdicts] == ["violation", "violation"]
        assert [v["rules"] for v in verdicts] == [["below-floor"], ["below-floor"]]
        podman("kill", "--signal", "TERM", container)
        assert sidecar.finish(timeout=20) == 0
    finally:
        subprocess.run(["podman", "rm", "-f", container], env=ENV, capture_output=True)
        sidecar.kill()
    assert sidecar.lines[-1]["msg"] == "stop"
    (event,) = setup.events(name)
    assert event.message.startswith("below-floor: pod ")
