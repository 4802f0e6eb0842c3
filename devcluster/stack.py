"""The real controllers on top of the test control plane: Kubeflow Trainer's
controller manager, JobSet's controller, Kueue's manager and, for scale tests
only, kwok, each built by devcluster/build-controllers.sh from its own Go
module at its pinned release. The pods run on the real node
(devcluster/node.py) that `local.start` adds; `stop()` stops it too.

None of the three controllers works without its admission webhooks, so they
are served for real, on loopback, the way controller-runtime's envtest does it
(WebhookInstallOptions): one throwaway CA signs a serving certificate for
127.0.0.1; each controller runs with its own certificate management off and
that certificate in its cert dir; each project's own webhook configurations,
read from its module's manifests (with its kustomize patches applied), are
installed with `clientConfig.url: https://127.0.0.1:<port><path>` and the CA
bundle instead of a Service.

kwok (`kwok=True`) simulates many nodes for tests and benches whose point is
scale: thousands of objects, no containers. It is not a kubelet, and nothing
that claims how a pod behaves is tested on it: kwok's own node-initialize,
pod-ready and pod-delete stages (read from its module) only mark its pods
Running and delete them. Its nodes (`add_node`) carry kwok's taint, so that
beside the real node only what tolerates it lands there (KWOK_FLAVOR).

Invariants:
- Every port (webhook, metrics, health) is a free port chosen here; nothing
  binds beyond 127.0.0.1.
- A controller is not returned before its readyz answers 200 and its webhook
  configurations are installed; webhook configurations are installed only
  after the server behind them is ready (their failurePolicy is Fail).
- Every process is the control plane harness's `_Process`: its own process
  group, killed as a group by `stop()`, its log in the plane's log dir (which
  the e2e conftest prints on failure). `started` keeps each group's id after
  `stop()`, so the suite can check at its end that none is left
  (`still_running`).
"""

from __future__ import annotations

import base64
import copy
import os
import pathlib
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from typing import Any

import kubernetes.client
import yaml

from devcluster import harness, procs

HERE = pathlib.Path(__file__).resolve().parent
READY_TIMEOUT_SECONDS = 120.0

# The releases of the version set the environment picks (devcluster/versions.py), as
# build-controllers.sh builds them.
TRAINER = ("github.com/kubeflow/trainer/v2", harness.VERSIONS.trainer)
JOBSET = ("sigs.k8s.io/jobset", harness.VERSIONS.jobset)
KUEUE = ("sigs.k8s.io/kueue", harness.VERSIONS.kueue)
KWOK = ("sigs.k8s.io/kwok", "v0.8.0")

# Nodes kwok manages carry this annotation (kwok's own convention).
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
# ... and, beside a real node, kwok's taint: only a pod that tolerates it lands on a kwok node (the
# TrainJobs of a bench, through their ResourceFlavor: KWOK_FLAVOR), never our controller's pods.
KWOK_TAINT = {"key": KWOK_NODE_ANNOTATION, "value": "fake", "effect": "NoSchedule"}
KWOK_LABELS = {"type": "kwok"}
# A ResourceFlavor's spec that puts what Kueue admits in it on kwok's nodes: their label as its
# nodeLabels (Kueue adds them to the pods' nodeSelector) and a toleration of their taint.
KWOK_FLAVOR = {"nodeLabels": KWOK_LABELS,
               "tolerations": [{"key": KWOK_NODE_ANNOTATION, "operator": "Equal", "value": "fake",
                                "effect": "NoSchedule"}]}

# Kueue's integrations the suite enables, and so the only Kueue webhooks it
# installs: a webhook for a framework that is not enabled has no handler and,
# failing closed, would refuse every object of that kind.
KUEUE_FRAMEWORKS = ("trainer.kubeflow.org/trainjob",)
KUEUE_WEBHOOK_RESOURCES = {
    "kueue.x-k8s.io": None,  # every Kueue resource
    "trainer.kubeflow.org": {"trainjobs"},
}


def build_binaries(binaries: str = "controllers") -> pathlib.Path:
    """Run build-controllers.sh for the set BINARIES (`controllers`, or `services`: CoreDNS and the
    registry); a no-op when cached. Returns the bin dir it prints."""
    proc = subprocess.run(["bash", str(HERE / "build-controllers.sh"), binaries], stdout=subprocess.PIPE, text=True,
                          check=False)
    if proc.returncode != 0:
        raise harness.HarnessError(f"devcluster/build-controllers.sh {binaries} failed with exit {proc.returncode}")
    return pathlib.Path(proc.stdout.strip().splitlines()[-1])


def _json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> None:
    """The subset of RFC 6902 the projects' webhook patches use: add, replace."""
    for op in ops:
        if op["op"] not in ("add", "replace"):
            raise harness.HarnessError(f"unsupported patch op {op['op']}")
        *parents, last = op["path"].lstrip("/").split("/")
        target: Any = doc
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        if isinstance(target, list):
            target[int(last)] = op["value"]
        else:
            target[last] = op["value"]


def loopback_webhooks(docs: list[dict[str, Any]], *, port: int, ca_bundle: str, prefix: str) -> list[dict[str, Any]]:
    """Point each webhook at https://127.0.0.1:<port><its service path>, with our CA."""
    out = []
    for doc in docs:
        if doc.get("kind") not in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            continue
        doc = copy.deepcopy(doc)
        doc["metadata"] = {"name": f"{prefix}-{doc['metadata']['name']}"}
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle}
        out.append(doc)
    return out


def _install_webhooks(api: kubernetes.client.ApiClient, docs: list[dict[str, Any]]) -> None:
    reg = kubernetes.client.AdmissionregistrationV1Api(api)
    for doc in docs:
        if doc["kind"] == "MutatingWebhookConfiguration":
            reg.create_mutating_webhook_configuration(doc)
        else:
            reg.create_validating_webhook_configuration(doc)


class Stack:
    """Trainer + JobSet (+ Kueue) (+ kwok) against a started control plane.

    `kueue=True` also runs Kueue with the TrainJob integration (its
    configuration is written here; a scenario sets up its queues itself).
    Nothing of ours runs here: our controller is the release's, installed by
    `local.start(release_dir=...)` as its Deployment's pods on the real node
    (devcluster/install.py).
    """

    def __init__(self, plane: Any, *, kueue: bool = False, kwok: bool = False, training: bool = True,
                 bin_dir: pathlib.Path | None = None) -> None:
        """TRAINING=False: none of Trainer, JobSet, Kueue (a cluster for the dispatcher alone)."""
        self.plane = plane
        self.training = training
        self.bin_dir = bin_dir or build_binaries()
        self.kueue = kueue
        self.kwok = kwok
        # The sidecar image the runtimes name: the release's once installed (devcluster/install.py).
        self.sidecar_image: str | None = None
        self.installed: Any = None  # devcluster/install.Installed, when the release runs our controller
        self.ours: Any = None  # devcluster/controller_pods.ControllerPods: the release's controller, once installed
        self.release_dir: pathlib.Path | None = None  # where a suite rendered the release installed here
        self.node: Any = None  # the real node (devcluster/node.py), set by local.start
        self.swept: list[str] = []  # what the start had to clean up after an earlier node
        self.workdir = pathlib.Path(plane.workdir) / "e2e"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._procs: dict[str, harness._Process] = {}
        self._health: dict[str, int] = {}  # name -> its readyz port, for a restart's wait
        self.started: list[tuple[str, procs.Group]] = []  # every start of every component, kept after stop()
        self._webhooks: list[dict[str, Any]] = []
        self.cert_dir = self.workdir / "webhook-certs"
        self.ca_bundle = ""

    # -- lifecycle ---------------------------------------------------------

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Stack:
        try:
            self._certs()
            with self.plane.api_client() as api:
                if self.training:
                    self._start_jobset(api)
                    self._start_trainer(api)
                if self.kueue:
                    self._start_kueue(api)
            if self.kwok:
                self._start_kwok()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Remove our webhook configurations (while the API is up), then kill every process."""
        try:
            with self.plane.api_client() as api:
                reg = kubernetes.client.AdmissionregistrationV1Api(api)
                for doc in self._webhooks:
                    try:
                        if doc["kind"] == "MutatingWebhookConfiguration":
                            reg.delete_mutating_webhook_configuration(doc["metadata"]["name"])
                        else:
                            reg.delete_validating_webhook_configuration(doc["metadata"]["name"])
                    except kubernetes.client.ApiException:
                        pass
        except Exception:  # the plane may already be gone; the processes still must go
            pass
        self._webhooks = []
        if self.ours is not None:
            self.ours.logbook.close()
        for name in reversed(list(self._procs)):
            self._procs[name].stop()
        if self.node is not None:
            node, self.node = self.node, None
            node.stop()

    def logs(self, *, lines: int = 200) -> str:
        text = "\n".join(f"---- {name} ({p.log_path})\n{p.tail(lines)}" for name, p in self._procs.items())
        if self.ours is not None:
            text += "\n" + self.ours.logbook.tail(lines)
        return text + ("\n" + self.node.logs(lines=lines) if self.node is not None else "")

    def check_alive(self) -> None:
        for proc in self._procs.values():
            proc.check_alive()
        if self.node is not None:
            self.node.check_alive()

    # -- faults (tests/faults) ---------------------------------------------

    def names(self) -> list[str]:
        """The processes this stack runs now (not the node's)."""
        return [name for name, p in self._procs.items() if p.popen is not None]

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send SIG to the process's group. SIGKILL also reaps it (it is then stopped: `start_process`
        runs it again); SIGSTOP and SIGCONT leave it as it is."""
        proc = self._procs[name]
        if proc.popen is None:
            raise harness.HarnessError(f"{name} is not running")
        os.killpg(proc.popen.pid, sig)
        if sig == signal.SIGKILL:
            proc.popen.wait()
            proc.popen = None

    def stop_process(self, name: str) -> None:
        """Stop one process (SIGTERM, then SIGKILL after the grace period)."""
        self._procs[name].stop()

    def start_process(self, name: str, *, wait: bool = True) -> None:
        """Run a stopped process again with its own command line, ports and configuration; with
        WAIT, return once its readyz answers 200. Its webhook configurations stayed installed, as a
        Deployment's do while its pod restarts."""
        proc = self._procs[name]
        if proc.popen is not None:
            raise harness.HarnessError(f"{name} is already running")
        proc.start()
        assert proc.group is not None
        self.started.append((name, proc.group))
        if wait and name in self._health:
            self._wait_ready(name, self._health[name])

    def restart(self, name: str) -> None:
        self.stop_process(name)
        self.start_process(name)

    def pid(self, name: str) -> int | None:
        proc = self._procs[name]
        return proc.popen.pid if proc.popen is not None else None

    def health_port(self, name: str) -> int:
        return self._health[name]

    # -- pieces ------------------------------------------------------------

    def _certs(self) -> None:
        pki = harness._Pki(self.workdir / "pki")
        crt, key = pki.issue("webhook", subject="/CN=127.0.0.1", server=True)
        self.cert_dir.mkdir(exist_ok=True)
        # controller-runtime's webhook server reads tls.crt and tls.key from its cert dir.
        (self.cert_dir / "tls.crt").write_bytes(pathlib.Path(crt).read_bytes())
        (self.cert_dir / "tls.key").write_bytes(pathlib.Path(key).read_bytes())
        self.ca_bundle = base64.b64encode(pathlib.Path(pki.path("ca.crt")).read_bytes()).decode()

    def _run(self, name: str, argv: list[str], *, env: dict[str, str] | None = None) -> harness._Process:
        proc = harness._Process(name, argv, pathlib.Path(self.plane.log_dir),
                                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **(env or {})})
        self._procs[name] = proc
        proc.start()
        assert proc.group is not None
        self.started.append((name, proc.group))
        return proc

    def _wait_ready(self, name: str, health_port: int) -> None:
        self._health[name] = health_port
        url = f"http://127.0.0.1:{health_port}/readyz"
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        last = ""
        while time.monotonic() < deadline:
            self._procs[name].check_alive()
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except urllib.error.HTTPError as e:
                last = f"{e.code} {e.read().decode(errors='replace')[-300:]}"
            except (urllib.error.URLError, OSError) as e:
                last = str(e)
            time.sleep(0.2)
        raise harness.HarnessError(f"{name} not ready at {url} after {READY_TIMEOUT_SECONDS}s: {last}\n"
                                   f"{self._procs[name].tail()}")

    def _webhooks_up(self, api: kubernetes.client.ApiClient, docs: list[dict[str, Any]]) -> None:
        _install_webhooks(api, docs)
        self._webhooks.extend(docs)

    def _config(self, name: str, doc: dict[str, Any]) -> pathlib.Path:
        path = self.workdir / f"{name}.config.yaml"
        path.write_text(yaml.safe_dump(doc))
        return path

    def _env(self) -> dict[str, str]:
        return {"KUBECONFIG": str(self.plane.kubeconfig)}

    def _start_jobset(self, api: kubernetes.client.ApiClient) -> None:
        webhook, metrics, health = (harness.free_port() for _ in range(3))
        config = self._config("jobset", {
            "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"port": webhook, "host": "127.0.0.1", "certDir": str(self.cert_dir)},
            "metrics": {"bindAddress": f"127.0.0.1:{metrics}", "certDir": str(self.cert_dir)},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        })
        self._run("jobset-controller", [str(self.bin_dir / "jobset-controller"), f"--config={config}",
                                        "--zap-log-level=2"], env=self._env())
        self._wait_ready("jobset-controller", health)
        root = harness.module_dir(*JOBSET) / "config/components/webhook"
        docs = harness.yaml_documents(root / "manifests.yaml")
        patches = {"MutatingWebhookConfiguration": "mutating-patch.yaml",
                   "ValidatingWebhookConfiguration": "validating-patch.yaml"}
        for doc in docs:
            if doc.get("kind") in patches:
                _json_patch(doc, yaml.safe_load((root / "patches" / patches[doc["kind"]]).read_text()))
        self._webhooks_up(api, loopback_webhooks(docs, port=webhook, ca_bundle=self.ca_bundle, prefix="e2e-jobset"))

    def _start_trainer(self, api: kubernetes.client.ApiClient) -> None:
        webhook, health = (harness.free_port() for _ in range(2))
        config = self._config("trainer", {
            "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
            "kind": "Configuration",
            "webhook": {"port": webhook, "host": "127.0.0.1"},
            # No metrics server: Trainer's serves plain HTTP with no authentication, to any local user.
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
            "leaderElection": {"leaderElect": False},
            "certManagement": {"enable": False},
        })
        # Trainer's Configuration has no cert dir: its webhook server uses
        # controller-runtime's default, $TMPDIR/k8s-webhook-server/serving-certs.
        tmp = self.workdir / "trainer-tmp"
        serving = tmp / "k8s-webhook-server" / "serving-certs"
        serving.mkdir(parents=True, exist_ok=True)
        for f in ("tls.crt", "tls.key"):
            (serving / f).write_bytes((self.cert_dir / f).read_bytes())
        self._run("trainer-controller-manager",
                  [str(self.bin_dir / "trainer-controller-manager"), f"--config={config}", "--zap-log-level=2"],
                  env={**self._env(), "TMPDIR": str(tmp)})
        self._wait_ready("trainer-controller-manager", health)
        root = harness.module_dir(*TRAINER) / "manifests/base/webhook"
        docs = harness.yaml_documents(root / "manifests.yaml")
        patches = {"MutatingWebhookConfiguration": "patch_mutating.yaml",
                   "ValidatingWebhookConfiguration": "patch_validating.yaml"}
        for doc in docs:
            if doc.get("kind") in patches:
                _json_patch(doc, yaml.safe_load((root / patches[doc["kind"]]).read_text()))
        self._webhooks_up(api, loopback_webhooks(docs, port=webhook, ca_bundle=self.ca_bundle,
                                                 prefix="e2e-trainer"))

    def _start_kueue(self, api: kubernetes.client.ApiClient) -> None:
        webhook, metrics, health = (harness.free_port() for _ in range(3))
        config = self._config("kueue", {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": "kueue-system",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"port": webhook, "host": "127.0.0.1", "certDir": str(self.cert_dir)},
            "metrics": {"bindAddress": f"127.0.0.1:{metrics}"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
            "integrations": {"frameworks": list(KUEUE_FRAMEWORKS)},
            # The on-demand visibility API server (an aggregated API with its own
            # fixed cert path) is not part of admission; leave it off.
            "featureGates": {"VisibilityOnDemand": False},
        })
        kubernetes.client.CoreV1Api(api).create_namespace({"metadata": {"name": "kueue-system"}})
        # With its certificate management off, Kueue (v0.18.3 and v0.19.2) reads its metrics
        # certificate from the fixed path /etc/kueue/metrics/certs. Give it that
        # path without touching the host: a private mount namespace in which
        # /etc is a read-only overlay of our directory on the real /etc.
        overlay = self.workdir / "kueue-etc"
        certs = overlay / "kueue" / "metrics" / "certs"
        certs.mkdir(parents=True, exist_ok=True)
        for f in ("tls.crt", "tls.key"):
            (certs / f).write_bytes((self.cert_dir / f).read_bytes())
        self._run("kueue", [
            "unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount -t overlay overlay -o "lowerdir=$1:/etc" /etc && shift && exec "$@"', "kueue-mount-ns",
            str(overlay), str(self.bin_dir / "kueue"), f"--config={config}", "--zap-log-level=2",
        ], env=self._env())
        self._wait_ready("kueue", health)
        root = harness.module_dir(*KUEUE) / "config/components/webhook"
        docs = harness.yaml_documents(root / "manifests.yaml")
        for doc in docs:
            doc["webhooks"] = [h for h in doc.get("webhooks", []) if _kueue_wants(h)]
        self._webhooks_up(api, loopback_webhooks(docs, port=webhook, ca_bundle=self.ca_bundle, prefix="e2e-kueue"))

    def _start_kwok(self) -> None:
        root = harness.module_dir(*KWOK) / "kustomize/stage"
        stages = [*harness.yaml_documents(root / "node/fast/node-initialize.yaml"),
                  *harness.yaml_documents(root / "pod/fast/pod-ready.yaml"),
                  *harness.yaml_documents(root / "pod/fast/pod-delete.yaml")]
        config = self.workdir / "kwok.yaml"
        config.write_text(yaml.safe_dump_all(stages))
        port = harness.free_port()
        self._run("kwok", [
            str(self.bin_dir / "kwok"), f"--kubeconfig={self.plane.kubeconfig}", f"--config={config}",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
            "--manage-all-nodes=false",
            # The kubelet's server for pods/log: the apiserver dials each node's InternalIP and port.
            f"--server-address=127.0.0.1:{port}", "--node-ip=127.0.0.1", f"--node-port={port}",
            f"--tls-cert-file={self.cert_dir / 'tls.crt'}", f"--tls-private-key-file={self.cert_dir / 'tls.key'}",
        ], env={"HOME": str(self.workdir)})  # kwok also reads ~/.kwok/kwok.yaml: keep the user's out

    def add_node(self, api: kubernetes.client.ApiClient, name: str, *, cpu: str = "8", memory: str = "16Gi",
                 timeout: float = 30.0) -> None:
        """A Node kwok manages, labelled KWOK_LABELS and tainted KWOK_TAINT; returns once kwok has
        made it Ready."""
        core = kubernetes.client.CoreV1Api(api)
        core.create_node({
            "metadata": {"name": name, "annotations": {KWOK_NODE_ANNOTATION: "fake"},
                         "labels": {**KWOK_LABELS, "kubernetes.io/hostname": name}},
            "spec": {"taints": [KWOK_TAINT]},
            "status": {"capacity": {"cpu": cpu, "memory": memory, "pods": "110"},
                       "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"}},
        })
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._procs["kwok"].check_alive()
            node = core.read_node(name)
            if any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or [])):
                # The apiserver taints a new Node not-ready; the node lifecycle
                # controller (which a plane without a real node does not run) lifts
                # the taint once the node reports Ready. Do that one step of its
                # job here, so the node is schedulable at once: kwok's taint stays.
                core.patch_node(name, {"spec": {"taints": [KWOK_TAINT]}})
                return
            time.sleep(0.2)
        raise harness.HarnessError(f"kwok did not make node {name} Ready in {timeout}s\n{self._procs['kwok'].tail()}")


def misplaced(api: kubernetes.client.ApiClient, namespace: str, *, ours: Iterable[Any] = ()) -> list[str]:
    """What runs where it must not, beside the real node: each pod of NAMESPACE bound to a node that
    is not kwok's, and each of OURS (our controller's pods) bound to one of kwok's or to none;
    'POD on NODE' each."""
    core = kubernetes.client.CoreV1Api(api)
    selector = ",".join(f"{k}={v}" for k, v in KWOK_LABELS.items())
    kwok = {n.metadata.name for n in core.list_node(label_selector=selector).items}
    wrong = [f"{p.metadata.name} on {p.spec.node_name}" for p in core.list_namespaced_pod(namespace).items
             if p.spec.node_name and p.spec.node_name not in kwok]
    return wrong + [f"{p.metadata.name} on {p.spec.node_name}" for p in ours
                    if not p.spec.node_name or p.spec.node_name in kwok]


def still_running(groups: Iterable[tuple[str, procs.Group]]) -> list[str]:
    """Which of these process groups still has a live process, each only while it is the one recorded
    (devcluster/procs.py: a number alone may name someone else's group by now)."""
    return [f"{name} (process group {group.pgid})" for name, group in groups if procs.is_ours(*group)]


def clean_up(groups: Iterable[tuple[str, procs.Group]]) -> None:
    """SIGKILL each group that is still the one recorded."""
    for _, group in groups:
        procs.signal_group(group.pgid, group.id, signal.SIGKILL)


def _kueue_wants(hook: dict[str, Any]) -> bool:
    for rule in hook.get("rules", []):
        for group in rule.get("apiGroups", []):
            if group in KUEUE_WEBHOOK_RESOURCES:
                wanted = KUEUE_WEBHOOK_RESOURCES[group]
                if wanted is None or set(rule.get("resources", [])) & wanted:
                    return True
    return False
