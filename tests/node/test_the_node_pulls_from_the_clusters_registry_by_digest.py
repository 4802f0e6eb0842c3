"""The cluster's registry (devcluster/registry.py) as a real node meets one: a pushed image is
pulled by the kubelet through the registry's name and its digest, and the pod status says which
digest runs; nothing is served or taken without the password, and its secrets are root's only.
"""

from __future__ import annotations

import json
import pathlib
import stat
import subprocess
import uuid
from collections.abc import Iterator

import kubernetes.client
import pytest

from devcluster import registry as registry_mod, stack as stack_mod
from release import contexts
from tests.node import kit

pytestmark = pytest.mark.cluster


@pytest.fixture
def fresh_image(tmp_path: pathlib.Path) -> Iterator[tuple[str, str]]:
    """A podman image no node has seen (a layer with a random file over busybox), and that file's text."""
    nonce = uuid.uuid4().hex
    (tmp_path / "nonce").write_text(nonce + "\n")
    (tmp_path / "Containerfile").write_text(f"FROM {kit.BUSYBOX}\nCOPY nonce /nonce\n")
    tag = f"localhost/dispatch-test/nonce:{nonce[:12]}"
    done = contexts.podman("build", "-q", "--isolation", "chroot", "-t", tag, str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr
    try:
        yield tag, nonce
    finally:
        contexts.podman("rmi", "--force", tag)


def test_a_pod_runs_an_image_pulled_by_digest_through_the_registrys_name(
        node_cluster: stack_mod.Stack, fresh_image: tuple[str, str]) -> None:
    registry = node_cluster.node.registry
    local, nonce = fresh_image
    digest = registry.push(local, "dispatch-test/nonce", "v1")
    reference = registry.reference("dispatch-test/nonce", "v1", digest)
    assert reference == f"registry.dispatch.test/dispatch-test/nonce:v1@{digest}"
    with node_cluster.plane.api_client() as api:
        core = kubernetes.client.CoreV1Api(api)
        namespace = kit.new_namespace(api, prefix="registry")
        core.create_namespaced_pod(namespace, {
            "metadata": {"name": "pulled"},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": reference, "imagePullPolicy": "IfNotPresent",
                "command": ["/bin/cat", "/nonce"]}]}})
        finished = kit.finished(core, namespace, "pulled", timeout=120)
        assert finished["status"]["phase"] == "Succeeded", finished["status"]
        assert kit.log(core, namespace, "pulled", "main") == nonce + "\n"
        status = kit.container_status(finished, "main")
        # The runtime's record of what ran: the registry's manifest digest, under the registry's name.
        assert status["imageID"] == f"registry.dispatch.test/dispatch-test/nonce@{digest}"
        events = core.list_namespaced_event(namespace, field_selector="involvedObject.name=pulled").items
        assert any(e.reason == "Pulled" and "Successfully pulled" in e.message for e in events), \
            [(e.reason, e.message) for e in events]


def test_no_pull_or_push_without_the_password(node_cluster: stack_mod.Stack, tmp_path: pathlib.Path) -> None:
    registry = node_cluster.node.registry
    assert registry.request("/v2/", authenticated=True) == 200
    assert registry.request("/v2/", authenticated=False) == 401
    # CoreDNS's image is there; without the password its manifest is not served, and no upload starts.
    assert registry.request("/v2/coredns/tags/list", authenticated=True) == 200
    assert registry.request("/v2/coredns/tags/list", authenticated=False) == 401
    assert registry.request("/v2/coredns/manifests/1.15.0", authenticated=False) == 401
    assert registry.request("/v2/coredns/blobs/uploads/", authenticated=False, method="POST") == 401

    # A real client with no credentials (or wrong ones) is refused both ways.
    none, wrong = tmp_path / "none.json", tmp_path / "wrong.json"
    none.write_text(json.dumps({"auths": {}}))
    wrong.write_text(json.dumps({"auths": {registry.endpoint: {"auth": "ZGlzcGF0Y2g6d3Jvbmc="}}}))  # dispatch:wrong
    for authfile in (none, wrong):
        pushed = contexts.podman("push", "--authfile", str(authfile), "--cert-dir", str(registry.cert_dir),
                                  kit.BUSYBOX, f"docker://{registry.endpoint}/coredns:1.15.0", timeout=120)
        assert pushed.returncode != 0 and "unauthorized" in pushed.stderr.lower(), pushed.stderr
        pulled = contexts.podman("pull", "--authfile", str(authfile), "--cert-dir", str(registry.cert_dir),
                                  f"docker://{registry.endpoint}/coredns:1.15.0", timeout=120)
        assert pulled.returncode != 0 and "unauthorized" in pulled.stderr.lower(), pulled.stderr


def test_the_registrys_secrets_are_roots_alone(node_cluster: stack_mod.Stack) -> None:
    registry = node_cluster.node.registry
    hosts = node_cluster.node.config_dir / "registry-hosts" / registry.name / "hosts.toml"
    for path in (registry.dir, registry.dir / "data", hosts.parent):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    for path in (registry.dir / "htpasswd", registry.dir / "config.yml", registry.authfile, hosts):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert path.stat().st_uid == 0
    # htpasswd holds a bcrypt hash, never the password.
    htpasswd = (registry.dir / "htpasswd").read_text()
    assert htpasswd.startswith(f"{registry_mod.USER}:$2b$") and registry.password not in htpasswd
    # It listens on loopback only.
    listening = subprocess.run(["ss", "-Hltn"], capture_output=True, text=True, check=True).stdout
    port = registry.endpoint.rsplit(":", 1)[1]
    assert [line.split()[3] for line in listening.splitlines() if line.split()[3].endswith(f":{port}")] == \
        [registry.endpoint]


@pytest.mark.parametrize("name", ["registry.example.com", "Registry.test", "test", "-a.test", "a_b.test",
                                  "registry.dispatch.test:5000"])
def test_a_registry_name_outside_test_is_refused_in_one_line(name: str) -> None:
    with pytest.raises(registry_mod.RegistryError) as refused:
        registry_mod.check_name(name)
    assert str(refused.value).count("\n") == 0 and "under .test" in str(refused.value)


def test_the_bcrypt_hash_is_one_libcrypt_checks() -> None:
    import ctypes
    import ctypes.util

    hashed = registry_mod.bcrypt_hash("s3cret")
    lib = ctypes.CDLL(ctypes.util.find_library("crypt"))
    lib.crypt.restype = ctypes.c_char_p
    lib.crypt.argtypes = (ctypes.c_char_p, ctypes.c_char_p)
    assert lib.crypt(b"s3cret", hashed.encode()) == hashed.encode()
    assert lib.crypt(b"other", hashed.encode()) != hashed.encode()
    assert registry_mod.bcrypt_hash("s3cret") != hashed  # a fresh salt each time
