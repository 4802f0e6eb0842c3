"""The local cluster is a whole one: a plain Deployment gets its ReplicaSet and pods from the real
kube-controller-manager, its Service an EndpointSlice, kube-proxy programs the ClusterIP, and a
pod on the real node reaches it by name through the cluster's DNS (CoreDNS, a pod itself, from the
cluster's registry), both fully qualified and by the short name the search path completes. A name
outside the cluster is not answered: nothing is forwarded off the host.
"""

from __future__ import annotations

import kubernetes.client
import pytest

from devcluster import dns, node, stack as stack_mod
from tests.node import kit

pytestmark = pytest.mark.cluster

PYTHON = "localhost/dispatch/sample-trainer:python"

SERVER = ("mkdir -p /tmp/www && echo \"hello from $POD\" > /tmp/www/index.html && "
          "exec httpd -f -p 8080 -h /tmp/www")
# The client is Python on Debian's glibc, whose resolver reads the search path and ndots the kubelet
# wrote (static busybox cannot resolve a name: static glibc has no NSS). Retried for a while:
# kube-proxy programs a new Service's rules within a second or so.
CLIENT = """
import os, socket, sys, time, urllib.request
for url in (f"http://web.{os.environ['NS']}.svc.cluster.local/", "http://web/"):
    for _ in range(30):
        try:
            print(url, urllib.request.urlopen(url, timeout=2).read().decode().strip())
            break
        except OSError as e:
            error = e
            time.sleep(1)
    else:
        sys.exit(f"no answer from {url}: {error}")
try:
    socket.getaddrinfo("example.com", 80)
    sys.exit("example.com resolved")
except socket.gaierror:
    print("done")
"""


def _web(namespace: str) -> list[tuple[str, dict[str, object]]]:
    labels = {"app": "web"}
    deployment = {
        "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [{
                "name": "web", "image": kit.BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["/bin/sh", "-c", SERVER],
                "env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                "ports": [{"containerPort": 8080}],
                "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}}]}}},
    }
    service = {"metadata": {"name": "web"},
               "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": 8080}]}}
    return [("deployment", deployment), ("service", service)]


def test_a_deployment_and_service_are_reached_by_name_from_a_pod(node_cluster: stack_mod.Stack) -> None:
    with node_cluster.plane.api_client() as api:
        core = kubernetes.client.CoreV1Api(api)
        apps = kubernetes.client.AppsV1Api(api)
        discovery = kubernetes.client.DiscoveryV1Api(api)
        namespace = kit.new_namespace(api, prefix="dns")
        (_, deployment), (_, service) = _web(namespace)
        apps.create_namespaced_deployment(namespace, deployment)
        core.create_namespaced_service(namespace, service)

        # The Deployment controller made a ReplicaSet, the ReplicaSet controller its pods, the
        # scheduler put them on the node, and the kubelet reports them ready.
        kit.wait("the Deployment to be Available", lambda: (
            (d := apps.read_namespaced_deployment("web", namespace)).status.available_replicas == 2 and d))
        replica_sets = apps.list_namespaced_replica_set(namespace).items
        assert [rs.metadata.owner_references[0].name for rs in replica_sets] == ["web"]
        pods = core.list_namespaced_pod(namespace, label_selector="app=web").items
        assert {p.spec.node_name for p in pods} == {node.NODE_NAME}
        assert {p.metadata.owner_references[0].name for p in pods} == {replica_sets[0].metadata.name}

        # The EndpointSlice controller wrote the Service's endpoints: both pods, ready.
        slice_ = kit.wait("the Service's EndpointSlice", lambda: next(iter(discovery.list_namespaced_endpoint_slice(
            namespace, label_selector="kubernetes.io/service-name=web").items), None))
        kit.wait("both endpoints ready", lambda: sorted(
            e.addresses[0] for e in discovery.read_namespaced_endpoint_slice(slice_.metadata.name, namespace).endpoints
            or [] if e.conditions.ready) == sorted(p.status.pod_ip for p in pods))

        core.create_namespaced_pod(namespace, {
            "metadata": {"name": "client"},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "client", "image": PYTHON, "imagePullPolicy": "IfNotPresent",
                "command": ["python3", "-c", CLIENT], "env": [{"name": "NS", "value": namespace}]}]}})
        finished = kit.finished(core, namespace, "client", timeout=120)
        output = kit.log(core, namespace, "client", "client")
        assert finished["status"]["phase"] == "Succeeded", output
        # The kubelet gave the pod the cluster's DNS and search path.
        assert finished["spec"]["dnsPolicy"] == "ClusterFirst"
        lines = output.splitlines()
        names = {p.metadata.name for p in pods}
        assert lines[0].startswith(f"http://web.{namespace}.svc.cluster.local/ hello from "), output
        assert lines[1].startswith("http://web/ hello from "), output
        assert {line.rsplit(" ", 1)[1] for line in lines[:2]} <= names
        assert lines[2] == "done", output


def test_coredns_runs_as_a_pod_from_the_clusters_registry(node_cluster: stack_mod.Stack) -> None:
    registry = node_cluster.node.registry
    with node_cluster.plane.api_client() as api:
        core = kubernetes.client.CoreV1Api(api)
        service = core.read_namespaced_service("kube-dns", dns.NAMESPACE)
        assert service.spec.cluster_ip == node.CLUSTER_DNS_IP
        [pod] = core.list_namespaced_pod(dns.NAMESPACE, label_selector="k8s-app=kube-dns").items
        [status] = pod.status.container_statuses
        image = pod.spec.containers[0].image
        assert image.startswith(f"{registry.name}/{dns.REPOSITORY}:{dns.VERSION}@sha256:")
        digest = image.rsplit("@", 1)[1]
        assert status.image_id == f"{registry.name}/{dns.REPOSITORY}@{digest}"
        assert status.ready and pod.spec.node_name == node.NODE_NAME
        assert pod.spec.security_context.run_as_non_root is True
