"""What devcluster/dispatcher_pod.py derives without a cluster: dispatcher.yaml placed in a test's
namespace as an overlay places it, the imageID a digest reference runs as, and which host
processes are one container's (by their cgroup under the node's kubepods)."""

from __future__ import annotations

import pathlib

import yaml

from devcluster import dispatcher_pod, node

REPO = pathlib.Path(__file__).resolve().parents[2]
SOURCES = REPO / "deployments" / "k8s" / "base" / "dispatcher"


def shipped() -> str:
    """The dispatcher part's documents, in the release's namespace as kustomize puts them."""
    docs = []
    for name in ("namespace.yaml", "serviceaccount.yaml", "role.yaml", "rolebinding.yaml", "deployment.yaml"):
        text = (SOURCES / name).read_text()
        if name != "namespace.yaml":
            text = text.replace("metadata:\n", "metadata:\n  namespace: tcab-dispatch\n", 1)
        docs.append(text)
    return "\n---\n".join(docs)


def test_the_overlay_moves_every_object_and_the_binding_s_subject_and_starts_nothing() -> None:
    docs = dispatcher_pod.overlay(shipped(), "t-1")
    assert sorted(d["kind"] for d in docs) == ["Deployment", "Role", "RoleBinding", "ServiceAccount"]
    assert {d["metadata"]["namespace"] for d in docs} == {"t-1"}
    binding = next(d for d in docs if d["kind"] == "RoleBinding")
    assert {s["namespace"] for s in binding["subjects"] if s["kind"] == "ServiceAccount"} == {"t-1"}
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 0
    released = dispatcher_pod.Released(shipped())
    assert (released.namespace, released.service_account, released.secret) == (
        "tcab-dispatch", "tcab-dispatcher", "tcab-backend")
    # The rest as released: the overlay leaves the Deployment's template alone.
    original = next(d for d in yaml.safe_load_all(shipped()) if d["kind"] == "Deployment")
    assert deployment["spec"]["template"] == original["spec"]["template"]


def test_the_image_id_of_a_digest_reference_drops_the_tag_and_keeps_a_registry_port() -> None:
    assert dispatcher_pod.digest_id("reg:5000/dispatch/dispatcher:0.1.0-g1@sha256:ab") == \
        "reg:5000/dispatch/dispatcher@sha256:ab"
    assert dispatcher_pod.digest_id("reg/dispatch/dispatcher@sha256:ab") == "reg/dispatch/dispatcher@sha256:ab"


def test_a_container_s_processes_are_those_in_its_own_cgroup_under_the_pod(tmp_path: pathlib.Path) -> None:
    uid, cid = "0f1e-22", "abc123"
    cgroups = {
        "10": f"4:memory:/{node.CGROUP_ROOT}/kubepods/burstable/pod{uid}/{cid}\n1:cpu:/{node.CGROUP_ROOT}/kubepods/burstable/pod{uid}/{cid}\n",
        "11": f"4:memory:/{node.CGROUP_ROOT}/kubepods/pod{uid}/{cid}\n",  # a guaranteed pod's
        "12": f"4:memory:/{node.CGROUP_ROOT}/kubepods/burstable/pod{uid}/pause0\n",  # the sandbox
        "13": f"4:memory:/{node.CGROUP_ROOT}/kubepods/burstable/pod-other/{cid}\n",
        "14": f"4:memory:/elsewhere/kubepods/burstable/pod{uid}/{cid}\n",
        "self": "0::/\n",
    }
    for pid, text in cgroups.items():
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "cgroup").write_text(text)
    assert node.container_pids(uid, f"containerd://{cid}", proc=tmp_path) == [10, 11]
