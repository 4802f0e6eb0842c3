"""A real Kubernetes control plane as local processes, for the integration tests.

etcd, kube-apiserver, kube-controller-manager and (optionally) kube-scheduler,
built by build.sh from the pinned Go module beside this file, run on loopback
with fresh ports, a fresh CA and fresh service-account signing keys, the way
controller-runtime's envtest runs them, plus the controllers envtest leaves out:
the controller manager's default set (Deployments, ReplicaSets, Jobs,
EndpointSlices, garbage collector, TTL-after-finished, service accounts and their
tokens, namespace deletion, ...). Without a node (devcluster/node.py) there are
no kubelets: pods stay Pending unless a test writes their status through the
status subresource.

Invariants:
- Every process runs in its own process group and is killed as a group by
  `stop()`, which runs on the normal path, on an exception, on SIGINT/SIGTERM
  and at interpreter exit (atexit). A stopped plane leaves no process, no
  listening port and no temp dir behind (logs are read before removal).
- Authorization is RBAC only, and each component has its own identity: the
  admin is a client certificate with O=system:masters; the controller manager
  is system:kube-controller-manager and runs each controller under its own
  service account (--use-service-account-credentials), as kubeadm sets it up.
- The CRDs come from the Trainer, JobSet and Kueue Go modules at the pinned
  versions (`go mod download -json`), are created unmodified, and the plane is
  not returned before each one is Established.
- `ExistingCluster` gives the same interface over a kubeconfig (TEST_KUBECONFIG)
  and never changes a CRD that is already there.

Usage for a person: `python -m devcluster.harness up|down` (state under
.state/cluster/).
"""

from __future__ import annotations

import argparse
import copy
import functools
import atexit
import json
import os
import pathlib
import shutil
import signal
import random
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import types
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import kubernetes.client
import kubernetes.config
import yaml

from devcluster import procs, versions

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
STATE_DIR = REPO / ".state" / "cluster"

# The CRDs the project talks to, each from its own module at the release of the version set the
# environment picks (devcluster/versions.py; the default set unless DISPATCH_*_VERSION say otherwise).
VERSIONS = versions.selected()
CRD_SOURCES: tuple[tuple[str, str, str], ...] = (
    ("github.com/kubeflow/trainer/v2", VERSIONS.trainer, "manifests/base/crds"),
    ("sigs.k8s.io/jobset", VERSIONS.jobset, "config/components/crd/bases"),
    ("sigs.k8s.io/kueue", VERSIONS.kueue, "config/components/crd/bases"),
)
TRAINER_MODULE = CRD_SOURCES[0]

KCM_QPS = 400  # kube-controller-manager's client rate limit (requests/s); the burst is twice it

# kube-controller-manager's default set (`*`: Deployments, ReplicaSets, StatefulSets, DaemonSets,
# Jobs, EndpointSlices, the garbage collector, ServiceAccounts and their tokens, namespaces, node
# lifecycle, ...), as on any cluster. A plane without a real node leaves out node lifecycle: no
# kubelet reports there, and the nodes it has (kwok's, in benches) are kept Ready by their simulator.
CONTROLLERS = "*"
NO_NODE_CONTROLLERS = "*,-node-lifecycle-controller"

SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"  # the kubernetes Service's ClusterIP: the first address of SERVICE_CIDR

# PodTemplates bypass the watch cache, so a watch on them is served by etcd and
# an etcd compaction makes an old resourceVersion 410 Gone deterministically.
# Nothing in the project uses PodTemplates; every other resource keeps its cache.
UNCACHED_RESOURCE = "podtemplates"

STOP_GRACE_SECONDS = 10.0
# The grace of a whole plane's teardown (`ControlPlane.stop`): nothing reads the plane after it. An
# apiserver whose node is already stopped spends its grace deleting its identity Lease through the
# node's address, gone with the node: 10 s of nothing per cluster.
TEARDOWN_GRACE_SECONDS = 2.0
READY_TIMEOUT_SECONDS = 120.0


class HarnessError(RuntimeError):
    """The control plane could not be built, started or reached."""


# Ports handed out by this process, never handed out twice.
_PORTS_GIVEN: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port() -> int:
    """A loopback port that is free now and stays free until its server binds it.

    Why not bind port 0: the kernel picks that port from the ephemeral range, the
    same range it draws the source ports of outgoing connections from. Between
    our close and the server's bind, the server's own first connection to the
    apiserver could take it (CI saw Kueue fail with "bind: address already in
    use" on its health port that way). Ports below the ephemeral range are never
    used as source ports, so only an explicit bind can race us, and within this
    process _PORTS_GIVEN rules that out.
    """
    low, _ = _ephemeral_range()
    start, stop = max(1024, low - 12000), max(1025, low)
    for _ in range(200):
        port = random.randrange(start, stop)
        if port in _PORTS_GIVEN:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _PORTS_GIVEN.add(port)
        return port
    raise HarnessError(f"no free loopback port in {start}-{stop - 1}")


def build_binaries() -> pathlib.Path:
    """Run build-controlplane.sh (a no-op when cached) and return the bin dir it prints."""
    proc = subprocess.run(
        ["bash", str(HERE / "build-controlplane.sh")], stdout=subprocess.PIPE, text=True, check=False
    )
    if proc.returncode != 0:
        raise HarnessError(f"devcluster/build-controlplane.sh failed with exit {proc.returncode}")
    return pathlib.Path(proc.stdout.strip().splitlines()[-1])


def binary(name: str, bin_dir: pathlib.Path) -> pathlib.Path:
    """KUBEBUILDER_ASSETS wins per binary (setup-envtest ships only some)."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets and os.access(pathlib.Path(assets) / name, os.X_OK):
        return pathlib.Path(assets) / name
    path = bin_dir / name
    if not os.access(path, os.X_OK):
        raise HarnessError(f"{name} not found in {bin_dir}: run `make controlplane`")
    return path


@functools.cache
def module_dir(module: str, version: str) -> pathlib.Path:
    """The module's directory in the Go module cache (downloaded, checksum-verified).

    Run outside any module so that nothing is added to this directory's go.mod
    or go.sum: these modules are data for the tests, not part of the build.
    """
    with tempfile.TemporaryDirectory(prefix="dispatch-gomod-") as cwd:
        proc = subprocess.run(
            ["go", "mod", "download", "-json", f"{module}@{version}"],
            cwd=cwd, env={**os.environ, "GO111MODULE": "on"},
            stdout=subprocess.PIPE, text=True, check=False,
        )
    info = json.loads(proc.stdout or "{}")
    if proc.returncode != 0 or "Dir" not in info:
        raise HarnessError(f"go mod download {module}@{version}: {info.get('Error', proc.returncode)}")
    return pathlib.Path(info["Dir"])


# libyaml's loader where PyYAML was built with it: the upstream projects' manifests are megabytes of
# OpenAPI schema, which the pure-Python loader takes seconds to read at every cluster start.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def yaml_documents(path: pathlib.Path) -> list[dict[str, Any]]:
    """The documents of a YAML file, empty ones left out (safe loading: plain data only)."""
    return [d for d in yaml.load_all(path.read_text(), Loader=_LOADER) if d]


@functools.cache
def _crds() -> tuple[dict[str, Any], ...]:
    return tuple(doc for module, version, sub in CRD_SOURCES
                 for path in sorted((module_dir(module, version) / sub).glob("*.yaml"))
                 for doc in yaml_documents(path) if doc.get("kind") == "CustomResourceDefinition")


def crd_documents() -> list[dict[str, Any]]:
    """The CRDs of Trainer, JobSet and Kueue, read once per process (copies: a caller may change them)."""
    return copy.deepcopy(list(_crds()))


def trainer_manifest(relative: str) -> list[dict[str, Any]]:
    """Documents of a file in Trainer's module, e.g. manifests/base/runtimes/x.yaml."""
    module, version, _ = TRAINER_MODULE
    return yaml_documents(module_dir(module, version) / relative)


def gone(read: Callable[[], object]) -> bool:
    """True once READ (a get of one object) answers 404; other errors raise."""
    try:
        read()
    except kubernetes.client.ApiException as e:
        if e.status == 404:
            return True
        raise
    return False


def create_namespace(api: kubernetes.client.ApiClient, name: str, *, labels: dict[str, str] | None = None,
                     timeout: float = 30.0) -> None:
    """Create a namespace and wait for its default ServiceAccount: pods are
    refused until the ServiceAccount controller has made it."""
    core = kubernetes.client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": name, "labels": labels or {}}})
    deadline = time.monotonic() + timeout
    while True:
        try:
            core.read_namespaced_service_account("default", name)
            return
        except kubernetes.client.ApiException as e:
            if e.status != 404 or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def install_crds(api: kubernetes.client.ApiClient, *, timeout: float = 60.0) -> list[str]:
    """Create each CRD that is missing (never overwrite one), wait for Established.

    Sent and read as plain dicts through the generic API: the typed client would
    re-validate megabytes of OpenAPI schema into models and drop what it does
    not know.
    """
    crds = kubernetes.client.CustomObjectsApi(api)
    group, version, plural = "apiextensions.k8s.io", "v1", "customresourcedefinitions"
    names = []
    for doc in crd_documents():
        names.append(doc["metadata"]["name"])
        try:
            crds.create_cluster_custom_object(group, version, plural, doc)
        except kubernetes.client.ApiException as e:
            if e.status != 409:
                raise
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            crd = crds.get_cluster_custom_object(group, version, plural, name)
            conditions = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
            if conditions.get("Established") == "True":
                break
            if time.monotonic() > deadline:
                raise HarnessError(f"CRD {name} not Established after {timeout}s: {conditions}")
            time.sleep(0.2)
    return names


def _write_kubeconfig(path: pathlib.Path, *, server: str, ca_file: str, user: dict[str, str],
                      namespace: str = "default") -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": ca_file}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "user", "namespace": namespace}}],
        "current-context": "local",
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(config))
    tmp.chmod(0o600)
    tmp.replace(path)


class _Pki:
    """A throwaway CA and the certificates signed by it, made with the openssl CLI."""

    @classmethod
    def reopen(cls, directory: pathlib.Path) -> _Pki:
        """The CA already made in DIRECTORY."""
        pki = cls.__new__(cls)
        pki.dir = directory
        return pki

    def __init__(self, directory: pathlib.Path) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ca.key")
        self._openssl("req", "-x509", "-new", "-key", "ca.key", "-days", "2", "-subj", "/CN=dispatch-test-ca",
                      "-out", "ca.crt")
        # The service-account signing key pair (ES256).
        self._openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "sa.key")
        self._openssl("ec", "-in", "sa.key", "-pubout", "-out", "sa.pub")

    def _openssl(self, *args: str) -> None:
        proc = subprocess.run(["openssl", *args], cwd=self.dir, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise HarnessError(f"openssl {args[0]} failed: {proc.stderr.strip()}")

    def issue(self, name: str, *, subject: str, server: bool = False, client: bool = False,
              sans: tuple[str, ...] = ()) -> tuple[str, str]:
        """Sign a key pair for `subject`; a server cert is valid for 127.0.0.1, localhost and SANS
        (each `IP:<address>` or `DNS:<name>`), and for client use too if CLIENT (a peer's)."""
        self._openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key")
        self._openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr")
        ext = self.dir / f"{name}.ext"
        usage = ",".join((["serverAuth"] if server else []) + (["clientAuth"] if client or not server else []))
        lines = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature", f"extendedKeyUsage={usage}"]
        if server:
            lines.append("subjectAltName=" + ",".join(("IP:127.0.0.1", "DNS:localhost", "DNS:kubernetes.default.svc",
                                                       *sans)))
        ext.write_text("\n".join(lines) + "\n")
        self._openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                      "-CAcreateserial", "-days", "2", "-extfile", ext.name, "-out", f"{name}.crt")
        return str(self.dir / f"{name}.crt"), str(self.dir / f"{name}.key")

    def path(self, name: str) -> str:
        return str(self.dir / name)


class _Process:
    """One component: its command line, its log file, its process group. ENV: its whole environment
    (None: this process's); PASS_FDS: descriptors it inherits (a lock it must hold while it lives)."""

    def __init__(self, name: str, argv: list[str], log_dir: pathlib.Path, *, env: dict[str, str] | None = None,
                 pass_fds: tuple[int, ...] = ()) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_dir / f"{name}.log"
        self.env = env
        self.pass_fds = pass_fds
        self.popen: subprocess.Popen[bytes] | None = None
        self.group: procs.Group | None = None  # the group of the last start, kept after stop()

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            log.write(f"==== start {time.strftime('%H:%M:%S')}: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True, env=self.env, pass_fds=self.pass_fds)
        self.group = procs.record(self.popen.pid)

    def check_alive(self) -> None:
        if self.popen is not None and self.popen.poll() is not None:
            raise HarnessError(f"{self.name} exited with {self.popen.returncode}; log:\n{self.tail()}")

    def stop(self, *, grace: float = STOP_GRACE_SECONDS) -> None:
        if self.popen is None:
            return
        popen, self.popen = self.popen, None
        _kill_group(popen.pid, wait=popen.wait, grace=grace)

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


def _kill_group(pgid: int, *, wait: Any = None, grace: float = STOP_GRACE_SECONDS) -> None:
    """SIGTERM the group, SIGKILL what is left after GRACE seconds."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if wait is not None:
            try:
                wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                continue
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return
    if wait is not None:
        wait()


_LIVE: list[ControlPlane] = []


def _stop_all() -> None:
    for plane in list(_LIVE):
        plane.stop()


def _on_signal(signum: int, frame: types.FrameType | None) -> None:
    # Turn SIGTERM into an exception so context managers and finalizers run.
    raise SystemExit(128 + signum)


atexit.register(_stop_all)


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager (+ kube-scheduler).

    Attributes after `start()`: kubeconfig, server, ca_file, bin_dir, log_dir.
    """

    def __init__(self, *, bin_dir: pathlib.Path | None = None, workdir: pathlib.Path | None = None,
                 scheduler: bool = True, crds: bool = True, detach: bool = False,
                 node_ip: str | None = None) -> None:
        self.bin_dir = bin_dir or build_binaries()
        # With a node address, the plane serves real nodes (devcluster/node.py): see _node_flags.
        self.node_ip = node_ip
        self._own_workdir = workdir is None
        self.workdir = pathlib.Path(workdir or tempfile.mkdtemp(prefix="dispatch-cp-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_dir = self.workdir / "logs"
        self.log_dir.mkdir(exist_ok=True)
        self._scheduler = scheduler
        self._crds = crds
        self._detach = detach
        self._procs: dict[str, _Process] = {}
        self.etcd_url = ""
        self.etcd_ca_file = ""
        self._etcd_client: tuple[str, str] = ("", "")
        self.server = ""
        self.ca_file = ""
        self.kubeconfig = ""
        self._admin_cert: tuple[str, str] = ("", "")
        self._minted = 0

    # -- lifecycle ---------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        if not self._detach:
            _LIVE.append(self)
            if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _on_signal)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        pki = _Pki(self.workdir / "pki")
        self.ca_file = pki.path("ca.crt")
        node_sans = (f"IP:{self.node_ip}", f"IP:{SERVICE_IP}") if self.node_ip else ()
        serving = pki.issue("apiserver", subject="/CN=kube-apiserver", server=True, sans=node_sans)
        self._admin_cert = pki.issue("admin", subject="/O=system:masters/CN=dispatch-admin")
        kcm_cert = pki.issue("kcm", subject="/CN=system:kube-controller-manager")
        sched_cert = pki.issue("scheduler", subject="/CN=system:kube-scheduler")

        client_port, peer_port, api_port = free_port(), free_port(), free_port()
        self.etcd_url = f"https://127.0.0.1:{client_port}"
        self.server = f"https://{self.node_ip or '127.0.0.1'}:{api_port}"
        peer = f"https://127.0.0.1:{peer_port}"
        # etcd holds every object, so whoever can write to it owns the cluster and, with a node,
        # the host. It trusts a CA of its own, which signs only etcd's certificates and the
        # apiserver's client certificate (the plane's CA signs the kubelet's and others').
        etcd_pki = _Pki(self.workdir / "etcd-pki")
        # Client use too: etcd's HTTP gateway dials etcd's own gRPC server with this certificate.
        etcd_serving = etcd_pki.issue("etcd-server", subject="/CN=etcd", server=True, client=True)
        etcd_peer = etcd_pki.issue("etcd-peer", subject="/CN=etcd-peer", server=True, client=True)
        self.etcd_ca_file = etcd_pki.path("ca.crt")
        self._etcd_client = etcd_pki.issue("apiserver-etcd-client", subject="/CN=kube-apiserver-etcd-client")
        self._add("etcd", [
            str(binary("etcd", self.bin_dir)),
            "--name=default",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
            f"--cert-file={etcd_serving[0]}", f"--key-file={etcd_serving[1]}",
            "--client-cert-auth=true", f"--trusted-ca-file={self.etcd_ca_file}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            f"--peer-cert-file={etcd_peer[0]}", f"--peer-key-file={etcd_peer[1]}",
            "--peer-client-cert-auth=true", f"--peer-trusted-ca-file={self.etcd_ca_file}",
            "--unsafe-no-fsync=true",  # test data: durability is not the point, speed is
            "--log-level=warn",
        ]).start()
        self._wait_http("etcd", f"{self.etcd_url}/health", context=self._etcd_context())

        self._add("kube-apiserver", [
            str(binary("kube-apiserver", self.bin_dir)),
            f"--etcd-servers={self.etcd_url}", f"--etcd-cafile={self.etcd_ca_file}",
            f"--etcd-certfile={self._etcd_client[0]}", f"--etcd-keyfile={self._etcd_client[1]}",
            f"--secure-port={api_port}",
            *self._address_flags(),
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--tls-cert-file={serving[0]}", f"--tls-private-key-file={serving[1]}",
            f"--client-ca-file={self.ca_file}",
            *self._authorization_flags(pki),
            f"--service-account-key-file={pki.path('sa.pub')}",
            f"--service-account-signing-key-file={pki.path('sa.key')}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            # Reach a node's "kubelet" (kwok's server in the e2e stack: pod logs) at its InternalIP,
            # not at its Hostname, which is a node name nothing resolves.
            "--kubelet-preferred-address-types=InternalIP",
            f"--watch-cache-sizes={UNCACHED_RESOURCE}#0",
            "--v=1",
        ]).start()
        self._wait_apiserver()

        self.kubeconfig = str(self.workdir / "admin.kubeconfig")
        _write_kubeconfig(pathlib.Path(self.kubeconfig), server=self.server, ca_file=self.ca_file,
                          user={"client-certificate": self._admin_cert[0], "client-key": self._admin_cert[1]})
        kcm_config = self.workdir / "kcm.kubeconfig"
        _write_kubeconfig(kcm_config, server=self.server, ca_file=self.ca_file,
                          user={"client-certificate": kcm_cert[0], "client-key": kcm_cert[1]})
        self._add("kube-controller-manager", [
            str(binary("kube-controller-manager", self.bin_dir)),
            f"--kubeconfig={kcm_config}",
            "--bind-address=127.0.0.1", "--secure-port=0",  # no serving endpoint needed
            "--leader-elect=false",
            "--use-service-account-credentials=true",
            f"--controllers={CONTROLLERS if self.node_ip else NO_NODE_CONTROLLERS}",
            f"--service-account-private-key-file={pki.path('sa.key')}",
            f"--root-ca-file={self.ca_file}",
            # Its client's default 20 requests/s let the garbage collector delete about 13 owned objects a
            # second (measured; a lookup of the owner, then the delete): a run queue finishing hundreds of
            # Jobs a second would leave their Secrets behind for minutes. Clusters of that size raise it too.
            f"--kube-api-qps={KCM_QPS}", f"--kube-api-burst={2 * KCM_QPS}",
            "--v=1",
        ]).start()
        if self._scheduler:
            sched_config = self.workdir / "scheduler.kubeconfig"
            _write_kubeconfig(sched_config, server=self.server, ca_file=self.ca_file,
                              user={"client-certificate": sched_cert[0], "client-key": sched_cert[1]})
            self._add("kube-scheduler", [
                str(binary("kube-scheduler", self.bin_dir)),
                f"--kubeconfig={sched_config}",
                f"--authentication-kubeconfig={sched_config}", f"--authorization-kubeconfig={sched_config}",
                "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
                "--leader-elect=false",
                "--v=1",
            ]).start()

        with self.api_client() as api:
            if self._crds:
                install_crds(api)
            self._wait_controller_manager(api)

    def _address_flags(self) -> list[str]:
        if not self.node_ip:
            # No kubernetes Service endpoints: a loopback advertise address is refused by the reconciler.
            return ["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none"]
        # Pods reach the apiserver through the kubernetes Service (kube-proxy on the node), whose
        # endpoint the lease reconciler keeps at the advertise address: the node's own address.
        return [f"--bind-address={self.node_ip}", f"--advertise-address={self.node_ip}"]

    def _authorization_flags(self, pki: _Pki) -> list[str]:
        if not self.node_ip:
            return ["--authorization-mode=RBAC"]
        # A kubelet is authorized as a node (its own pods, their Secrets and tokens, its Node), and
        # the apiserver reaches the kubelet (logs, exec) with a client certificate of its own.
        client = pki.issue("apiserver-kubelet-client", subject="/O=system:masters/CN=kube-apiserver-kubelet-client")
        return ["--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
                f"--kubelet-client-certificate={client[0]}", f"--kubelet-client-key={client[1]}",
                f"--kubelet-certificate-authority={self.ca_file}"]

    def issue(self, name: str, *, subject: str, server: bool = False, sans: tuple[str, ...] = ()) -> tuple[str, str]:
        """A certificate signed by the plane's CA (for a node's kubelet and kube-proxy)."""
        return _Pki.reopen(self.workdir / "pki").issue(name, subject=subject, server=server, sans=sans)

    def _add(self, name: str, argv: list[str]) -> _Process:
        proc = _Process(name, argv, self.log_dir)
        self._procs[name] = proc
        return proc

    def stop(self) -> None:
        """Kill every process group and remove the workdir; safe to call twice."""
        for name in reversed(list(self._procs)):
            self._procs[name].stop(grace=TEARDOWN_GRACE_SECONDS)
        if self in _LIVE:
            _LIVE.remove(self)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def stop_apiserver(self) -> None:
        self.stop_component("kube-apiserver")

    def start_apiserver(self) -> None:
        """Start kube-apiserver again, same port, same etcd, same keys; wait for /readyz."""
        self.start_component("kube-apiserver")

    def stop_component(self, name: str) -> None:
        """Stop one of etcd, kube-apiserver, kube-controller-manager, kube-scheduler (SIGTERM, then
        SIGKILL after the grace period); its data (etcd's directory) stays."""
        self._procs[name].stop()

    def start_component(self, name: str) -> None:
        """Run a stopped component again with its own command line (same ports, data and keys) and
        wait until it answers: etcd's /health, the apiserver's /readyz; the controller manager and
        the scheduler serve nothing to ask, so for them: still running after a moment."""
        proc = self._procs[name]
        if proc.popen is not None:
            raise HarnessError(f"{name} is already running")
        proc.start()
        if name == "etcd":
            self._wait_http("etcd", f"{self.etcd_url}/health", context=self._etcd_context())
            if self._procs["kube-apiserver"].popen is not None:
                self._wait_apiserver()  # back on its storage
        elif name == "kube-apiserver":
            self._wait_apiserver()
        else:
            time.sleep(1.0)
            proc.check_alive()

    # -- waiting -----------------------------------------------------------

    def _ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca_file)
        context.load_cert_chain(*self._admin_cert)
        return context

    def _etcd_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.etcd_ca_file)
        context.load_cert_chain(*self._etcd_client)
        return context

    def _wait_http(self, component: str, url: str, *, context: ssl.SSLContext | None) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        last = ""
        while time.monotonic() < deadline:
            self._procs[component].check_alive()
            try:
                with urllib.request.urlopen(url, timeout=2, context=context) as response:
                    if response.status == 200:
                        return
            except urllib.error.HTTPError as e:
                last = f"{e.code} {e.read().decode(errors='replace')[-400:]}"
            except (urllib.error.URLError, OSError) as e:
                last = str(e)
            time.sleep(0.2)
        raise HarnessError(f"{component} not ready at {url} after {READY_TIMEOUT_SECONDS}s: {last}\n"
                           f"{self._procs[component].tail()}")

    def _wait_apiserver(self) -> None:
        self._wait_http("kube-apiserver", f"{self.server}/readyz", context=self._ssl_context())

    def wait_service(self) -> None:
        """Wait until the apiserver answers at the kubernetes Service's address, as pods reach it.

        An apiserver that stops gracefully takes its address out of the Service's endpoints, so
        kube-proxy rejects connections to the Service; once the apiserver is back it writes the
        address again, and kube-proxy programs it only when its own watch, backing off while the
        apiserver was away (up to 30 s), lists again. From the node's host the same rules apply.
        Only for a plane whose node runs kube-proxy."""
        if not self.node_ip:
            raise HarnessError("no node: the kubernetes Service has no endpoint to wait for")
        self._wait_http("kube-apiserver", f"https://{SERVICE_IP}/readyz", context=self._ssl_context())

    def _wait_controller_manager(self, api: kubernetes.client.ApiClient) -> None:
        # The "default" ServiceAccount is written by the serviceaccount
        # controller, through a token the manager minted for it: proof that the
        # manager is up and authenticated with service-account credentials.
        core = kubernetes.client.CoreV1Api(api)
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            self._procs["kube-controller-manager"].check_alive()
            try:
                core.read_namespaced_service_account("default", "default")
                return
            except kubernetes.client.ApiException as e:
                if e.status != 404:
                    raise
            time.sleep(0.2)
        raise HarnessError("kube-controller-manager did not create the default ServiceAccount\n"
                           f"{self._procs['kube-controller-manager'].tail()}")

    # -- clients -----------------------------------------------------------

    def api_client(self) -> kubernetes.client.ApiClient:
        """A new admin client; the caller closes it (it is a context manager)."""
        return kubernetes.config.new_client_from_config(config_file=self.kubeconfig)

    def mint_kubeconfig(self, *, namespace: str, service_account: str,
                        expiration_seconds: int = 3600) -> str:
        return _mint_kubeconfig(self, namespace=namespace, service_account=service_account,
                                expiration_seconds=expiration_seconds)

    def expired_resource_version(self, *, namespace: str) -> str:
        """A PodTemplate resourceVersion that a watch must answer with 410 Gone.

        Writes three PodTemplates, then compacts etcd at the newest one's
        revision (resourceVersions are etcd revisions). A watch from the first
        starts one revision after it, which is now below the compacted revision
        (compaction at R keeps R itself, hence three writes, not two).
        PodTemplates are not in the watch cache, so etcd answers, with 410.
        """
        with self.api_client() as api:
            core = kubernetes.client.CoreV1Api(api)
            versions = []
            for _ in range(3):
                body = {"metadata": {"generateName": "expire-"},
                        "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}
                created = core.create_namespaced_pod_template(namespace, body)
                versions.append(created.metadata.resource_version)
        self._etcd_post("/v3/kv/compaction", {"revision": versions[2], "physical": True})
        return str(versions[0])

    def compact_and_defragment(self) -> dict[str, int]:
        """Compact etcd at its current revision and defragment it; the revision and db sizes before/after.

        For benches that run several rows on one control plane: each row's history (and the Events
        it left) would otherwise weigh on the rows after it.
        """
        before = self._etcd_post("/v3/maintenance/status", {})
        revision = int(before["header"]["revision"])
        try:
            self._etcd_post("/v3/kv/compaction", {"revision": revision, "physical": True})
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            if "compacted" not in text:  # nothing written since the last compaction: nothing to do
                raise HarnessError(f"etcd compaction at {revision} failed: {e.code} {text[-300:]}") from None
        self._etcd_post("/v3/maintenance/defragment", {})
        after = self._etcd_post("/v3/maintenance/status", {})
        return {"revision": revision, "db_size_before": int(before.get("dbSize", 0)),
                "db_size_after": int(after.get("dbSize", 0))}

    def _etcd_post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(self.etcd_url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10, context=self._etcd_context()) as response:
            return dict(json.load(response))

    def logs(self, *, lines: int = 40) -> str:
        return "\n".join(f"---- {name} ({p.log_path})\n{p.tail(lines)}" for name, p in self._procs.items())

    def pids(self) -> dict[str, int]:
        return {name: p.popen.pid for name, p in self._procs.items() if p.popen is not None}

    def groups(self) -> dict[str, procs.Group]:
        """Each running component's process group with its leader's identity."""
        return {name: p.group for name, p in self._procs.items() if p.popen is not None and p.group is not None}


def _mint_kubeconfig(plane: ControlPlane | ExistingCluster, *, namespace: str, service_account: str,
                     expiration_seconds: int) -> str:
    """Create the ServiceAccount if missing, TokenRequest a token, write a kubeconfig."""
    with plane.api_client() as api:
        core = kubernetes.client.CoreV1Api(api)
        try:
            core.create_namespaced_service_account(namespace, {"metadata": {"name": service_account}})
        except kubernetes.client.ApiException as e:
            if e.status != 409:
                raise
        request = {"spec": {"expirationSeconds": expiration_seconds}}
        response = core.create_namespaced_service_account_token(service_account, namespace, request)
        token = response.status.token
    directory = pathlib.Path(plane.log_dir).parent / "minted"
    directory.mkdir(exist_ok=True)
    plane._minted += 1
    path = directory / f"{namespace}.{service_account}.{plane._minted}.kubeconfig"
    _write_kubeconfig(path, server=plane.server, ca_file=plane.ca_file, user={"token": token},
                      namespace=namespace)
    return str(path)


class ExistingCluster:
    """The ControlPlane interface over an existing cluster's kubeconfig (TEST_KUBECONFIG).

    Only what a cluster one does not own allows: no process control, and the
    CRDs are created only where missing. Minted kubeconfigs and logs go to a
    temp dir removed by `stop()`.
    """

    def __init__(self, kubeconfig: str, *, crds: bool = True) -> None:
        self.kubeconfig = kubeconfig
        self.workdir = pathlib.Path(tempfile.mkdtemp(prefix="dispatch-cluster-"))
        self.log_dir = self.workdir / "logs"
        self.log_dir.mkdir()
        self.bin_dir = pathlib.Path(os.environ.get("KUBEBUILDER_ASSETS", ""))
        loader = kubernetes.config.kube_config.KubeConfigLoader(
            config_dict=yaml.safe_load(pathlib.Path(kubeconfig).read_text()))
        configuration = kubernetes.client.Configuration()
        loader.load_and_set(configuration)
        self.server = configuration.host
        self.ca_file = configuration.ssl_ca_cert or ""
        self._minted = 0
        self._crds = crds

    def start(self) -> ExistingCluster:
        if self._crds:
            with self.api_client() as api:
                install_crds(api)
        return self

    def api_client(self) -> kubernetes.client.ApiClient:
        return kubernetes.config.new_client_from_config(config_file=self.kubeconfig)

    def mint_kubeconfig(self, *, namespace: str, service_account: str,
                        expiration_seconds: int = 3600) -> str:
        return _mint_kubeconfig(self, namespace=namespace, service_account=service_account,
                                expiration_seconds=expiration_seconds)

    def expired_resource_version(self, *, namespace: str) -> str:
        # etcd is not ours to compact. A cluster's apiserver compacts every 5
        # minutes by default (to the revision it saw 5 minutes before), so on a
        # cluster up for more than about 10 minutes revision 1 is gone. On a
        # younger one the 410 test fails, and says why.
        return "1"

    def stop_apiserver(self) -> None:
        raise HarnessError("stop_apiserver: TEST_KUBECONFIG names a cluster this harness does not run")

    def start_apiserver(self) -> None:
        raise HarnessError("start_apiserver: TEST_KUBECONFIG names a cluster this harness does not run")

    def logs(self, *, lines: int = 40) -> str:
        return f"(existing cluster {self.server}: no process logs)"

    def stop(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)


# -- the command line for a person ------------------------------------------------


def _up() -> int:
    if (STATE_DIR / "pids.json").exists():
        print(f"a cluster is already up: export KUBECONFIG={STATE_DIR / 'admin.kubeconfig'}"
              " (or `make cluster-down`)", file=sys.stderr)
        return 1
    shutil.rmtree(STATE_DIR, ignore_errors=True)
    plane = ControlPlane(workdir=STATE_DIR, detach=True)
    plane.start()
    groups = {name: group._asdict() for name, group in plane.groups().items()}
    (STATE_DIR / "pids.json").write_text(json.dumps(groups))
    print(f"logs in {plane.log_dir}; stop with `make cluster-down`", file=sys.stderr)
    print(f"export KUBECONFIG={plane.kubeconfig}")
    return 0


def _down() -> int:
    pids_file = STATE_DIR / "pids.json"
    if pids_file.exists():
        # Each group only while it is the one recorded: a number read from a file may name anyone's now.
        for group in reversed(list(json.loads(pids_file.read_text()).values())):
            procs.stop_group(int(group["pgid"]), str(group["id"]), grace=STOP_GRACE_SECONDS)
    shutil.rmtree(STATE_DIR, ignore_errors=True)
    print("cluster down", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devcluster.harness",
                                     description="Start or stop the local test control plane.")
    parser.add_argument("action", choices=["up", "down"], help="up: start in the background; down: stop it")
    args = parser.parse_args(argv)
    try:
        return _up() if args.action == "up" else _down()
    except HarnessError as e:
        print(f"harness: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
