"""No port the local cluster opens serves its data or takes a write from a caller with no
credentials; what is left is health, and one read-only exception.

The cluster as `toolkit cluster up` runs it (`local.start` with the release: the control plane,
Trainer, JobSet, Kueue, the real node, and our controller installed from the release, its two
replicas as pods). Every TCP socket listening in the host's network namespace that belongs to one
of its processes (a member of a recorded process group, or a containerd shim of the node) is found
through the kernel (/proc/net/tcp{,6} and each process's descriptors), and every port our
controller's pods declare is dialed at the pod's IP; each is asked, in plain HTTP and in TLS with no client certificate, for what each kind of server there
would give away: etcd's keys, the apiserver's and the kubelet's pods, metrics, configuration,
profiles. A port is:

- closed: nothing but errors (a TLS handshake that wants a client certificate, 401, 403, 404);
- health: 200 only on /healthz, /readyz, /livez, /version or /leaderz (what the apiserver shows
  anyone, and which replica of our controller leads);
- open: 200 on anything else.

The only open port allowed serves read-only counters with no object names: kube-proxy's metrics,
whose server v1.37 can neither turn off (its address must be IP:port) nor authenticate. Our
controller's /metrics wants a token allowed `get` on it. Health only where something asks it: the controllers' readiness
probes, the apiserver and the scheduler (their public health paths). Not the kubelet's, not
kube-proxy's.
"""

from __future__ import annotations

import http.client
import pathlib
import socket
import ssl
from collections.abc import Iterator

import kubernetes.client
import pytest

from devcluster import install, local, node
from devcluster import stack as stack_mod

pytestmark = pytest.mark.cluster

HEALTH = ("/healthz", "/readyz", "/livez", "/version", "/leaderz")
DATA = ("/metrics", "/api/v1/pods", "/pods", "/configz", "/debug/pprof/", "/stats/summary", "/v3/kv/range")
ALLOWED_OPEN = {"kube-proxy"}
ALLOWED_HEALTH = {"kube-apiserver", "kube-scheduler", "jobset-controller", "trainer-controller-manager", "kueue",
                  "dispatch-controller"}


@pytest.fixture(scope="module")
def everything(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stack_mod.Stack]:
    running = local.start(release_dir=tmp_path_factory.mktemp("release"))
    try:
        yield running
    finally:
        running.stop()
        running.plane.stop()


def _listening() -> dict[int, tuple[str, int]]:
    """Socket inode -> (address, port) of every listening TCP socket in this network namespace."""
    found = {}
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in pathlib.Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":
                continue
            address_hex, port_hex = fields[1].split(":")
            raw = bytes.fromhex(address_hex)
            # /proc prints each 32-bit word of the address in host (little-endian) order.
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            found[int(fields[9])] = (socket.inet_ntop(family, raw), int(port_hex, 16))
    return found


def _owners(running: stack_mod.Stack) -> dict[int, str]:
    """PID -> component name for every process of the cluster."""
    assert running.node is not None
    groups = {g.pgid: name for name, g in (*running.plane.groups().items(), *running.started, *running.node.started)}
    owners = {pid: "containerd-shim" for pid in node._shim_pids()}
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                pgid = int((entry / "stat").read_text().rpartition(")")[2].split()[2])
            except OSError:
                continue
            if pgid in groups:
                owners[int(entry.name)] = groups[pgid]
    return owners


def _ports(running: stack_mod.Stack) -> dict[tuple[str, int], str]:
    """(address to dial, port) -> component, of every port the cluster's processes listen on."""
    listening = _listening()
    found = {}
    for pid, name in _owners(running).items():
        try:
            links = [p.readlink() for p in pathlib.Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        for link in links:
            text = str(link)
            if text.startswith("socket:[") and (inode := int(text[8:-1])) in listening:
                address, port = listening[inode]
                dial = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(address, address)
                found[(dial, port)] = name
    return found


def _pod_ports(running: stack_mod.Stack) -> dict[tuple[str, int], str]:
    """(pod IP, port) -> "dispatch-controller" for every port our controller's pods declare."""
    with running.plane.api_client() as api:
        pods = kubernetes.client.CoreV1Api(api).list_namespaced_pod(install.NAMESPACE,
                                                                    label_selector=install.SELECTOR).items
    return {(pod.status.pod_ip, port.container_port): "dispatch-controller"
            for pod in pods if pod.status.pod_ip for c in pod.spec.containers for port in c.ports or []}


def _status(address: str, port: int, path: str, *, tls: bool) -> int:
    """The HTTP status a caller with no credentials gets, or 0 for none (refused, reset, TLS alert)."""
    try:
        if tls:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(address, port, timeout=3, context=context)
        else:
            conn = http.client.HTTPConnection(address, port, timeout=3)
        try:
            if path == "/v3/kv/range":  # etcd: every key
                conn.request("POST", path, body=b'{"key":"AA==","range_end":"AA=="}')
            else:
                conn.request("GET", path)
            return conn.getresponse().status
        finally:
            conn.close()
    except (OSError, http.client.HTTPException):
        return 0


def test_every_port_wants_credentials_or_serves_health_only(everything: stack_mod.Stack) -> None:
    ports = {**_ports(everything), **_pod_ports(everything)}
    assert {"etcd", "kube-apiserver", "kubelet", "kueue", "dispatch-controller"} <= set(ports.values()), ports
    seen: dict[str, list[str]] = {}
    kinds: dict[str, set[str]] = {"open": set(), "health": set()}
    for (address, port), name in sorted(ports.items()):
        answered = [path for path in (*HEALTH, *DATA) for tls in (False, True)
                    if _status(address, port, path, tls=tls) == 200]
        seen.setdefault(name, []).append(f"{address}:{port} {sorted(set(answered))}")
        if set(answered) - set(HEALTH):
            kinds["open"].add(name)
        elif answered:
            kinds["health"].add(name)
    assert kinds["open"] <= ALLOWED_OPEN, seen
    assert kinds["health"] <= ALLOWED_HEALTH, seen
