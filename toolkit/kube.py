"""The one module that speaks to the Kubernetes API.

Everything else in the toolkit works on plain dicts (the JSON the apiserver
sends) and calls these functions; only this module imports `kubernetes`.
That keeps the rules (raising, detection, status) testable without a client
and puts every retry and error mapping in one place.

What it guarantees:
- Errors come back as the small exception tree below (Conflict, NotFound,
  Gone, ...), never as a raw ApiException, so callers can branch on them.
- Transient failures (connection errors, 429, 5xx) are retried with a
  bounded backoff (toolkit.backoff), honouring Retry-After. A 409 is NOT retried here: a
  conflict means the caller's read is stale and only the caller knows how to
  recompute; `read_modify_write` is that loop, and it never re-sends the
  body it computed from the stale read.
- Updates are preconditioned: `replace` sends the body's resourceVersion,
  which the apiserver compares, so a blind write is impossible through it.
- A watch that ends is the caller's to restart (`controller.informer`
  does), and a 410 Gone surfaces as `Gone` so the caller relists.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import kubernetes.client
import kubernetes.config
import kubernetes.leaderelection.electionconfig
import kubernetes.leaderelection.leaderelection
import kubernetes.leaderelection.resourcelock.leaselock
import urllib3.exceptions

from toolkit import backoff, paths

Obj = dict[str, Any]
T = TypeVar("T")

log = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class Conflict(ApiError):
    """409 Conflict on an update: the object changed since it was read."""


class AlreadyExists(ApiError):
    """409 AlreadyExists on a create."""


class NotFound(ApiError):
    pass


class Gone(ApiError):
    """410: the resourceVersion is too old; relist."""


class Forbidden(ApiError):
    pass


class Invalid(ApiError):
    """422: the apiserver (or a CEL rule, or a webhook) refused the object."""


class ConfigError(Exception):
    """No usable cluster configuration (kubeconfig or in-cluster)."""


class TooManyConflicts(Exception):
    pass


_ERRORS: dict[int, type[ApiError]] = {404: NotFound, 410: Gone, 403: Forbidden, 422: Invalid}
_TRANSIENT = {429, 500, 502, 503, 504}
# The longest a Retry-After holds one request (the backoff between retries is at most 2 s).
RETRY_AFTER_LIMIT = 10.0


def _error(status: int, body: bytes | str | None) -> ApiError:
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        data = {}
    reason = str(data.get("reason") or "")
    message = str(data.get("message") or body or "")
    if status == 409:
        return AlreadyExists(status, reason, message) if reason == "AlreadyExists" else Conflict(
            status, reason, message
        )
    return _ERRORS.get(status, ApiError)(status, reason, message)


class Client:
    """A thin JSON client over one `kubernetes.client.ApiClient`."""

    def __init__(self, api_client: kubernetes.client.ApiClient, *, retries: int = 5) -> None:
        self.api_client = api_client
        self.retries = retries

    # -- raw requests -------------------------------------------------

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | tuple[float, float] | None = 30,
    ) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        req = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        return self.api_client.call_api(*req, _request_timeout=timeout)

    def request(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Obj:
        """One API call with transient retries; the decoded JSON body."""
        pause = backoff.Backoff(base=0.05, cap=2.0, retry_cap=RETRY_AFTER_LIMIT)
        for attempt in range(self.retries + 1):
            try:
                resp = self._send(method, path, query=query, body=body, content_type=content_type)
                data = resp.read()
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                if attempt == self.retries:
                    raise ApiError(0, "Unreachable", str(exc)) from exc
                time.sleep(pause.next_delay())
                continue
            if 200 <= resp.status <= 299:
                return json.loads(data) if data else {}
            if resp.status in _TRANSIENT and attempt < self.retries:
                retry_after = backoff.retry_after(resp.getheader("Retry-After"), limit=RETRY_AFTER_LIMIT)
                time.sleep(pause.next_delay(retry_after=retry_after))
                continue
            raise _error(resp.status, data)
        raise AssertionError("unreachable")

    # -- objects ------------------------------------------------------

    def get(self, res: paths.Resource, *, name: str, namespace: str | None = None) -> Obj:
        return self.request("GET", res.path(namespace=namespace, name=name))

    def create(self, res: paths.Resource, obj: Obj, *, namespace: str | None = None) -> Obj:
        body = {"apiVersion": res.api_version, "kind": res.kind, **obj}
        return self.request("POST", res.path(namespace=namespace), body=body)

    def replace(self, res: paths.Resource, obj: Obj, *, subresource: str | None = None) -> Obj:
        """PUT the object back; its metadata.resourceVersion is the precondition."""
        meta = obj["metadata"]
        if not meta.get("resourceVersion"):
            raise ValueError("replace needs the resourceVersion read: a blind write is not allowed")
        path = res.path(namespace=meta.get("namespace"), name=meta["name"], sub=subresource)
        return self.request("PUT", path, body=obj)

    def merge_patch(
        self, res: paths.Resource, patch: Obj, *, name: str, namespace: str | None = None, subresource: str | None = None
    ) -> Obj:
        path = res.path(namespace=namespace, name=name, sub=subresource)
        return self.request("PATCH", path, body=patch, content_type="application/merge-patch+json")

    def delete(self, res: paths.Resource, *, name: str, namespace: str | None = None) -> None:
        self.request("DELETE", res.path(namespace=namespace, name=name))

    def list(
        self,
        res: paths.Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[Obj], str]:
        """All items (paged) and the list's resourceVersion."""
        items: list[Obj] = []
        cont = ""
        while True:
            query = [("limit", "500")]
            if label_selector:
                query.append(("labelSelector", label_selector))
            if field_selector:
                query.append(("fieldSelector", field_selector))
            if cont:
                query.append(("continue", cont))
            data = self.request("GET", res.path(namespace=namespace), query=query)
            items.extend(data.get("items") or [])
            meta = data.get("metadata") or {}
            cont = meta.get("continue") or ""
            if not cont:
                return items, str(meta.get("resourceVersion") or "")

    def watch(
        self,
        res: paths.Resource,
        *,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
    ) -> Iterator[tuple[str, Obj]]:
        """(type, object) events until the server ends the watch.

        Bookmarks are yielded (their object carries the new resourceVersion).
        A 410, as a status or as an ERROR event, raises Gone.
        """
        query = [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        if label_selector:
            query.append(("labelSelector", label_selector))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        resp = self._send(
            "GET", res.path(namespace=namespace), query=query, timeout=(10, timeout_seconds + 30)
        )
        if not 200 <= resp.status <= 299:
            raise _error(resp.status, resp.read())
        raw = resp.response
        try:
            buffer = b""
            for chunk in raw.stream(amt=None, decode_content=False):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    kind, obj = event.get("type", ""), event.get("object") or {}
                    if kind == "ERROR":
                        raise _error(int(obj.get("code") or 500), json.dumps(obj))
                    yield kind, obj
        finally:
            raw.release_conn()

    # -- conflict handling -------------------------------------------

    def read_modify_write(
        self,
        res: paths.Resource,
        *,
        name: str,
        namespace: str | None,
        compute: Callable[[Obj], tuple[Obj | None, T]],
        subresource: str | None = None,
        max_conflicts: int = 1000,
        on_conflict: Callable[[], None] | None = None,
        first: Obj | None = None,
    ) -> tuple[T, int]:
        """Read, compute, write preconditioned on the read; on 409 read again.

        `compute(obj)` returns (new object or None for "nothing to write",
        a result). It is called on every fresh read, so the written value is
        always derived from the version it is preconditioned on. `first` is
        an already-read copy to start from (an informer's): it is only a
        hint, a conflict sends us back to the server. Returns the result of
        the compute whose write landed and the number of conflicts retried.
        """
        conflicts = 0
        obj = first if first is not None else self.get(res, name=name, namespace=namespace)
        while True:
            new, result = compute(obj)
            if new is None:
                return result, conflicts
            try:
                self.replace(res, new, subresource=subresource)
                return result, conflicts
            except Conflict:
                conflicts += 1
                if on_conflict is not None:
                    on_conflict()
                if conflicts >= max_conflicts:
                    raise TooManyConflicts(f"{res.kind} {name}: {conflicts} conflicts in a row") from None
                obj = self.get(res, name=name, namespace=namespace)

    # -- events -------------------------------------------------------

    def warn(self, *, involved: Obj, reason: str, message: str, component: str) -> Obj:
        """A Warning Event on `involved` (an object read from the server)."""
        meta = involved["metadata"]
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion"),
                "kind": involved.get("kind"),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "type": "Warning",
            "reason": reason,
            "message": message[:1024],
            "source": {"component": component},
            "reportingComponent": component,
            "reportingInstance": os.environ.get("HOSTNAME", component),
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        return self.create(paths.EVENT, event, namespace=meta["namespace"])


def load(*, kubeconfig: str | None = None, context: str | None = None) -> Client:
    """A client from a kubeconfig path, $KUBECONFIG, or the in-cluster
    ServiceAccount, in that order."""
    configuration = kubernetes.client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    try:
        if path or not os.environ.get("KUBERNETES_SERVICE_HOST"):
            kubernetes.config.load_kube_config(
                config_file=path, context=context, client_configuration=configuration
            )
        else:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
    except (kubernetes.config.ConfigException, OSError, ValueError, TypeError, KeyError) as exc:
        # The config library raises several unrelated types for one user mistake.
        where = path or ("in-cluster" if os.environ.get("KUBERNETES_SERVICE_HOST") else "~/.kube/config")
        raise ConfigError(f"cannot load a cluster config from {where}: {exc}") from None
    # Enough connections for the controller's reconcile workers and watches.
    configuration.connection_pool_maxsize = 32
    return Client(kubernetes.client.ApiClient(configuration))


def from_api_client(api_client: Any) -> Client:
    return Client(api_client)


def run_leader_election(
    client: Client,
    *,
    lease_name: str,
    namespace: str,
    on_started: Callable[[], None],
    on_stopped: Callable[[], None],
    identity: str | None = None,
    lease_duration: int = 15,
    renew_deadline: int = 10,
    retry_period: int = 2,
) -> None:
    """Block campaigning for the Lease; call `on_started` (in a thread) when
    leading and `on_stopped` once the lease could not be renewed.

    Uses the client library's leader election with a Lease lock; the lock is
    pointed at our ApiClient instead of the library's global default.
    """
    lock = kubernetes.leaderelection.resourcelock.leaselock.LeaseLock(
        lease_name, namespace, identity or f"{os.environ.get('HOSTNAME', 'controller')}-{uuid.uuid4().hex[:8]}"
    )
    lock.api_instance = kubernetes.client.CoordinationV1Api(client.api_client)
    config = kubernetes.leaderelection.electionconfig.Config(
        lock, lease_duration, renew_deadline, retry_period, on_started, on_stopped
    )
    kubernetes.leaderelection.leaderelection.LeaderElection(config).run()
