"""The controller's release image (images/controller.Containerfile, built as the release builds
it: `make release-images`) is a minimal root on the local Python base (images/mkroot.py: no
shell), runs as non-root
on a read-only root filesystem, imports every module it carries, is at most
60 MB, makes the metrics endpoint's self-signed certificate with the cryptography it
carries, and, started the way the shipped Deployment starts it (its command,
args, env and securityContext, read from deployment.yaml), reaches the
controller and refuses a missing cluster config in one line.
Its behaviour against a cluster is proven by the process tests here.

Built and run through the Docker Engine API (tests/containers.py: the
docker SDK against podman's Docker-compatible service, docs/images.md).
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import docker
import pytest
import yaml

from release import contexts
from tests import containers

REPO = pathlib.Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "deployments" / "k8s" / "base" / "controller"

pytestmark = pytest.mark.images


@pytest.fixture(scope="module")
def client() -> Iterator[docker.DockerClient]:
    with containers.client() as c:
        yield c


@pytest.fixture(scope="module")
def image() -> str:
    return containers.release_image("controller")


def shipped_container() -> tuple[dict[str, Any], dict[str, Any]]:
    """The controller container of deployment.yaml, and its pod spec."""
    deployment = yaml.safe_load((MANIFESTS / "deployment.yaml").read_text())
    namespace = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["namespace"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "controller"]
    env = {}
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = var["value"]
        else:  # the Downward API: only the namespace is used
            assert var["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace", var
            env[var["name"]] = namespace
    return {**container, "env": env}, pod


def run_as_shipped(client: docker.DockerClient, image: str, *extra_args: str) -> tuple[int, str]:
    """Run the image as the Deployment would (command, args, env, user,
    read-only root, capabilities), with EXTRA_ARGS after its args; returns
    the exit status and stderr."""
    container, pod = shipped_container()
    security = container.get("securityContext") or {}
    user = security.get("runAsUser", (pod.get("securityContext") or {}).get("runAsUser"))
    kwargs: dict[str, Any] = {
        "environment": container["env"],
        "network_mode": "none",
        "read_only": bool(security.get("readOnlyRootFilesystem")),
        "cap_drop": (security.get("capabilities") or {}).get("drop"),
        "security_opt": [] if security.get("allowPrivilegeEscalation", True) else ["no-new-privileges"],
    }
    if user is not None:
        kwargs["user"] = f"{user}:{user}"
    if container.get("command"):  # Kubernetes' command replaces the ENTRYPOINT
        kwargs["entrypoint"] = container["command"]
    args = [*(container.get("args") or []), *extra_args]
    ran = containers.run_to_end(client, image, args, **kwargs)
    return ran.exit_code, ran.stderr.decode()


def test_the_image_runs_non_root_with_its_whole_import_graph(client: docker.DockerClient, image: str) -> None:
    assert client.images.get(image).attrs["Config"]["User"] == "65532:65532"
    ran = containers.run_to_end(
        client, image,
        ["-c", "import controller.app, controller.cli, importlib.metadata, kubernetes, prometheus_client; "
         "from toolkit import history; print(kubernetes.__version__, history.parse(None).high_water == 0, "
         "importlib.metadata.version('pydantic'))"],  # METADATA is carried as its headers alone
        entrypoint=["python3"], network_mode="none", read_only=True,
    )
    assert (ran.exit_code, ran.stdout.decode().strip()) == (0, "37.0.2 True 2.14.4"), ran.stderr


def test_every_module_the_image_carries_imports_and_it_has_no_shell(client: docker.DockerClient, image: str) -> None:
    carried, failures = containers.import_every_module(client, image)
    assert failures == [] and carried > 1000, (carried, failures)
    containers.assert_no_shell(client, image)
    # The target (docs/benchmarks.md, "Images"), as the dispatcher's.
    assert contexts.size_bytes(image) <= 60_000_000, contexts.size_bytes(image)


def test_the_image_makes_the_metrics_certificate_with_the_cryptography_it_carries(
    client: docker.DockerClient, image: str
) -> None:
    """No --metrics-cert-dir: the self-signed certificate is made at start with the image's
    cryptography and loaded by its ssl, on the read-only root as the non-root user."""
    ran = containers.run_to_end(
        client, image,
        ["-c", "import cryptography; from controller import certs; "
         "cert, key = certs.self_signed(hosts=certs.default_hosts()); certs.server_context(None); "
         "print(cryptography.__version__); print(cert.decode().splitlines()[0]); "
         "print(key.decode().splitlines()[0])"],
        entrypoint=["python3"], network_mode="none", read_only=True,
    )
    out = ran.stdout.decode().split("\n")
    assert ran.exit_code == 0, ran.stderr
    assert out[:3] == ["51.0.1", "-----BEGIN CERTIFICATE-----", "-----BEGIN PRIVATE KEY-----"], out


def test_started_as_the_deployment_starts_it_the_controller_refuses_a_missing_config_in_one_line(
    client: docker.DockerClient, image: str
) -> None:
    """A usage error here (exit 2) would mean the manifest's command or args
    do not match the image's entry point: the shipped pods would never start."""
    status, stderr = run_as_shipped(client, image, "--kubeconfig", "/nonexistent")
    assert (status, stderr.strip().splitlines()) == (1, [
        "Error: --kubeconfig: cannot load a cluster config from /nonexistent: "
        "Invalid kube-config file. No configuration found."
    ])
