"""Reading our controller's /metrics the way Prometheus reads it: over
HTTPS, with the bearer token of a ServiceAccount bound to the shipped
ClusterRole `dispatch-metrics-reader` (deployments/k8s/base/controller/
metrics-reader.yaml). Used by the tests and the benches that run the
controller on the local cluster.

The controller's certificate is self-signed (none is mounted here), so the
scrape does not verify it, as a Prometheus `insecure_skip_verify` scrape
does not: what the test proves is the token check, not the certificate.
"""

from __future__ import annotations

import pathlib
import re
import ssl
import urllib.error
import urllib.request
from typing import Any

import yaml

from toolkit import kube

READER = pathlib.Path(__file__).resolve().parents[1] / "deployments" / "k8s" / "base" / "controller" / "metrics-reader.yaml"
RBAC = "/apis/rbac.authorization.k8s.io/v1"


def reader_role() -> dict[str, Any]:
    """The shipped ClusterRole, as the manifest has it."""
    doc: dict[str, Any] = yaml.safe_load(READER.read_text())
    return doc


def reader_token(client: kube.Client, *, namespace: str, account: str = "dispatch-metrics-scraper",
                 bind: bool = True) -> str:
    """A token of ServiceAccount ACCOUNT in NAMESPACE (made if missing), bound to
    `dispatch-metrics-reader` unless not `bind` (a token the apiserver
    authenticates and the controller must refuse)."""
    role = reader_role()
    try:
        client.request("POST", f"{RBAC}/clusterroles", body=role)
    except kube.AlreadyExists:
        pass
    try:
        client.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", body={"metadata": {"name": account}})
    except kube.AlreadyExists:
        pass
    if bind:
        try:
            client.request("POST", f"{RBAC}/clusterrolebindings", body={
                "metadata": {"name": f"{role['metadata']['name']}-{namespace}-{account}"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": role["metadata"]["name"]},
                "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
            })
        except kube.AlreadyExists:
            pass
    answer = client.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
                            body={"spec": {"expirationSeconds": 3600}})
    return str(answer["status"]["token"])


def scrape(port: int, *, token: str | None, host: str = "127.0.0.1", path: str = "/metrics") -> tuple[int, str]:
    """GET https://HOST:PORT/metrics with the token (or none): the status and the body."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(f"https://{host}:{port}{path}")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def sample(text: str, series: str) -> float | None:
    """The value of one series (`name` or `name{labels}` exactly as exposed), or None."""
    found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None
