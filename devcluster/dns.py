"""The local cluster's DNS: CoreDNS as a Deployment in kube-system, as kind and k3d run it.

CoreDNS is built from its Go module (build-controllers.sh, set `services`) into a one-file image
(`devcluster/coredns.Containerfile`, FROM scratch), pushed to the cluster's registry
(devcluster/registry.py) and run from there by its digest, like any workload image. The
`kube-dns` Service has the ClusterIP the kubelet gives every pod as its nameserver
(`node.CLUSTER_DNS_IP`), so `svc.ns.svc.cluster.local` and, through the search path, `svc` resolve.

Invariants:
- CoreDNS answers for the cluster's zones only (`cluster.local` and the reverse zones) from the
  kubernetes plugin, and forwards nothing: any other name is refused, so no query leaves the host.
- It runs as an ordinary pod would in a restricted namespace: non-root (UID 65532), no capabilities,
  a read-only root filesystem, listening on 1053 (the Service maps port 53 to it), with its own
  ServiceAccount allowed to list and watch only what the kubernetes plugin reads.
- `install` returns once the Deployment is Available, i.e. CoreDNS reports ready: it has synced
  Services and EndpointSlices from the apiserver.
"""

from __future__ import annotations

import hashlib
import pathlib
import shutil
import subprocess
import tempfile
import time
from typing import Any

import kubernetes.client
import yaml

from devcluster import harness, node, registry as registry_mod
from release import contexts

HERE = pathlib.Path(__file__).resolve().parent
VERSION = "1.15.0"  # build-controllers.sh's `services` table builds this release
REPOSITORY = "coredns"
NAMESPACE = "kube-system"
PORT = 1053  # CoreDNS's own port in its pod: unprivileged, so it needs no capability
READY_TIMEOUT_SECONDS = 120.0

COREFILE = f"""\
{node.CLUSTER_DOMAIN}:{PORT} in-addr.arpa:{PORT} ip6.arpa:{PORT} {{
    errors
    health :8080
    ready :8181
    kubernetes {node.CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        pods insecure
        ttl 30
    }}
    cache 30
    loadbalance
}}
"""


def local_image(binary: pathlib.Path) -> str:
    """The podman image of BINARY (built once per binary: the tag carries its hash)."""
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()[:12]
    tag = f"localhost/dispatch-base/coredns:{VERSION}-{digest}"
    if contexts.podman("image", "exists", tag).returncode == 0:
        return tag
    with tempfile.TemporaryDirectory(prefix="dispatch-coredns-") as context:
        shutil.copy(binary, pathlib.Path(context) / "coredns")
        done = contexts.podman("build", "-q", "--isolation", "chroot", "-f", str(HERE / "coredns.Containerfile"),
                                "-t", tag, context, timeout=300)
    if done.returncode != 0:
        raise harness.HarnessError(f"podman build of the CoreDNS image exited {done.returncode}: "
                                   f"{done.stderr.strip()[-500:]}")
    return tag


def manifests(image: str) -> list[dict[str, Any]]:
    """CoreDNS's ServiceAccount, RBAC, ConfigMap, Deployment and the kube-dns Service."""
    labels = {"k8s-app": "kube-dns"}
    meta = {"name": "coredns", "namespace": NAMESPACE, "labels": labels}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "system:coredns", "labels": labels},
         "rules": [{"apiGroups": [""], "resources": ["services", "pods", "namespaces"], "verbs": ["list", "watch"]},
                   {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "system:coredns", "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
         "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": NAMESPACE}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"Corefile": COREFILE}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
         "spec": {
             "replicas": 1,
             "selector": {"matchLabels": labels},
             "template": {
                 "metadata": {"labels": labels},
                 "spec": {
                     "serviceAccountName": "coredns",
                     "priorityClassName": "system-cluster-critical",
                     # Its own lookups (none: it forwards nothing) must not go to itself.
                     "dnsPolicy": "Default",
                     "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                         "seccompProfile": {"type": "RuntimeDefault"}},
                     "containers": [{
                         "name": "coredns",
                         "image": image,
                         "imagePullPolicy": "IfNotPresent",
                         "args": ["-conf", "/etc/coredns/Corefile"],
                         "ports": [{"name": "dns", "containerPort": PORT, "protocol": "UDP"},
                                   {"name": "dns-tcp", "containerPort": PORT, "protocol": "TCP"}],
                         "resources": {"requests": {"cpu": "50m", "memory": "70Mi"}, "limits": {"memory": "170Mi"}},
                         "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                             "capabilities": {"drop": ["ALL"]}},
                         "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}, "periodSeconds": 10,
                                           "failureThreshold": 5},
                         "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 1},
                         "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}],
                     }],
                     "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                 },
             },
         }},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "kube-dns", "namespace": NAMESPACE, "labels": labels},
         "spec": {"selector": labels, "clusterIP": node.CLUSTER_DNS_IP,
                  "ports": [{"name": "dns", "port": 53, "targetPort": PORT, "protocol": "UDP"},
                            {"name": "dns-tcp", "port": 53, "targetPort": PORT, "protocol": "TCP"}]}},
    ]


def install(plane: harness.ControlPlane, registry: registry_mod.Registry, *, bin_dir: pathlib.Path) -> str:
    """Push CoreDNS's image to REGISTRY, apply its manifests, wait until it is Available; returns
    the image reference the pod runs."""
    source = local_image(bin_dir / "coredns")
    digest = registry.push(source, REPOSITORY, VERSION)
    image = registry.reference(REPOSITORY, VERSION, digest)
    kubectl = harness.binary("kubectl", plane.bin_dir)
    done = subprocess.run([str(kubectl), f"--kubeconfig={plane.kubeconfig}", "apply", "--server-side",
                           "--field-manager=dispatch-devcluster", "-f", "-"],
                          input=yaml.safe_dump_all(manifests(image)), capture_output=True, text=True, timeout=60,
                          check=False)
    if done.returncode != 0:
        raise harness.HarnessError(f"kubectl apply of CoreDNS failed: {done.stderr.strip()[-500:]}")
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    with plane.api_client() as api:
        apps = kubernetes.client.AppsV1Api(api)
        while True:
            status = apps.read_namespaced_deployment("coredns", NAMESPACE).status
            if (status.available_replicas or 0) >= 1 and (status.updated_replicas or 0) >= 1:
                return image
            if time.monotonic() > deadline:
                raise harness.HarnessError(f"CoreDNS not Available after {READY_TIMEOUT_SECONDS}s: {status}")
            time.sleep(0.2)
