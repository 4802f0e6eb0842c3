"""The one Kubernetes client: the controller's and the dispatcher's.

Everything else works on plain dicts (the JSON the apiserver sends) and
calls this module; only it (and `toolkit.informer`, through it) speaks HTTP
to the apiserver, besides the Lease calls of the leader election
(`toolkit.leader`, over a client's configuration). That keeps the rules
(raising, detection, the dispatcher's ledger) testable without a client and
puts every retry and error mapping in one place. The sidecar has its own
standard-library reader (`sidecar/api.py`) for its footprint, over the same
`toolkit.paths`. A client comes from the cluster configuration
(`toolkit.clusterconfig.load`) or from an ApiClient already made
(`from_api_client`); the Events it writes are built by `toolkit.events`.

What it guarantees:
- Errors come back as the small exception tree below (Conflict, NotFound,
  Gone, Unavailable, ...), never as a raw urllib3 or client exception, so
  callers can branch on them; every one is an `ApiError` with `.status`
  (0 for "no answer").
- Transient failures (no answer, 429, 5xx) are retried `retries` times with a
  bounded backoff (toolkit.backoff), honouring Retry-After. The controller
  uses 5; the dispatcher 0, because its loop owns the backoff (it knows
  whether a retry is safe: a create is retried as a create, whose
  AlreadyExists is the answer). A 409 is never retried here: a conflict means
  the caller's read is stale; `read_modify_write` is that loop, and it never
  re-sends the body it computed from the stale read.
- Updates are preconditioned: `replace` sends the body's resourceVersion,
  which the apiserver compares, so a blind write is impossible through it.
- Lists are paged (`pages`, `list`); a watch streams lines through the
  client's own line iterator, and a 410 (status or ERROR event) raises Gone.
  The loop around them (resume, relist) is `toolkit.informer`.
- Every request carries a timeout, so a connection whose packets are dropped
  ends as Unavailable instead of holding its caller: `TIMEOUT` (connect, then
  each read) for a request or a list's page; a watch asks the server to end it
  after `timeout_seconds` and reads with 30 s more than that.

The transport is the kubernetes client's own connection pool (its TLS, proxy
and client-certificate settings) and its own credentials
(`get_api_key_with_prefix`, which refreshes an in-cluster or exec token as
the client does), but no generated method: those validate every argument
with pydantic and walk the body to serialize it, about a third of the
dispatcher's CPU per request. Every answer is read to its end, so its
connection goes back to the pool (an unread body closes it, and the next
request pays a new TLS handshake). There is no client-side QPS limit (the
Python client has none): the requests in flight are bounded by the callers'
workers, and the apiserver's priority and fairness queues the rest.
`requests` counts the requests sent, for the benchmarks.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import kubernetes.client
import kubernetes.watch.watch
import urllib3

from toolkit import backoff, events, paths

Obj = dict[str, Any]
T = TypeVar("T")
Query = list[tuple[str, str]]


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"HTTP {status} {reason}: {message}" if status else f"{reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class Unavailable(ApiError):
    """No answer: connection refused or reset, a timeout, a body that is not JSON."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "Unavailable", message)


class Conflict(ApiError):
    """409 Conflict on an update (the object changed since it was read), or a failed precondition."""


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


class TooManyConflicts(Exception):
    pass


_ERRORS: dict[int, type[ApiError]] = {404: NotFound, 410: Gone, 403: Forbidden, 422: Invalid}
_TRANSIENT = {429, 500, 502, 503, 504}
# The longest a Retry-After holds one request (the backoff between retries is at most 2 s).
RETRY_AFTER_LIMIT = 10.0
TIMEOUT = (5.0, 30.0)  # connect, read (seconds)


def error(status: int, body: bytes | str | None) -> ApiError:
    """The exception for an answer with this status and (Status JSON) body."""
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    reason = str(data.get("reason") or "")
    text = body.decode(errors="replace") if isinstance(body, bytes) else str(body or "")
    message = str(data.get("message") or text[:512])
    if status == 409:
        return (AlreadyExists if reason == "AlreadyExists" else Conflict)(status, reason, message)
    return _ERRORS.get(status, ApiError)(status, reason, message)


def _selectors(label_selector: str | None, field_selector: str | None) -> Query:
    """The query parameters of a list's or a watch's selectors (none for an empty one)."""
    return [(key, value) for key, value in (("labelSelector", label_selector), ("fieldSelector", field_selector))
            if value]


def _transport_error(exc: BaseException) -> Unavailable:
    return Unavailable(f"{type(exc).__name__}: {exc}")


class Client:
    """A JSON client over one `kubernetes.client.ApiClient`'s pool and credentials."""

    def __init__(self, api_client: kubernetes.client.ApiClient, *, retries: int = 5) -> None:
        self.api_client = api_client
        self.configuration = api_client.configuration
        self.retries = retries
        self.requests = 0
        self._pool = api_client.rest_client.pool_manager
        self._timeout = urllib3.Timeout(connect=TIMEOUT[0], read=TIMEOUT[1])

    def close(self) -> None:
        self.api_client.close()

    # -- raw requests -------------------------------------------------

    def _send(self, method: str, path: str, *, query: Query | None = None, body: Any = None,
              content_type: str = "application/json", timeout: urllib3.Timeout | None = None,
              stream: bool = False) -> urllib3.BaseHTTPResponse:
        """One HTTP request; the answer (read whole unless `stream`). Raises Unavailable."""
        self.requests += 1
        headers = {**self.api_client.default_headers, "Accept": "application/json",
                   "User-Agent": self.api_client.user_agent}
        token = self.configuration.get_api_key_with_prefix("BearerToken")
        if token:
            headers["Authorization"] = token
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        url = self.configuration.host + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        try:
            return self._pool.request(method, url, body=data, headers=headers, timeout=timeout or self._timeout,
                                      retries=False, preload_content=not stream)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise _transport_error(exc) from None

    def raw(self, method: str, path: str, *, query: Query | None = None, body: Any = None,
            content_type: str = "application/json") -> bytes:
        """One API call with transient retries; the answer's body."""
        pause = backoff.Backoff(base=0.05, cap=2.0, retry_cap=RETRY_AFTER_LIMIT)
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                resp = self._send(method, path, query=query, body=body, content_type=content_type)
            except Unavailable:
                if last:
                    raise
                time.sleep(pause.next_delay())
                continue
            if 200 <= resp.status <= 299:
                return bytes(resp.data or b"")
            if resp.status in _TRANSIENT and not last:
                retry_after = backoff.retry_after(resp.headers.get("Retry-After"), limit=RETRY_AFTER_LIMIT)
                time.sleep(pause.next_delay(retry_after=retry_after))
                continue
            raise error(resp.status, resp.data)
        raise AssertionError("unreachable")

    def request(self, method: str, path: str, *, query: Query | None = None, body: Any = None,
                content_type: str = "application/json") -> Obj:
        """One API call with transient retries; the decoded JSON body."""
        data = self.raw(method, path, query=query, body=body, content_type=content_type)
        try:
            decoded = json.loads(data) if data else {}
        except ValueError as exc:
            raise Unavailable(f"the answer to {method} {path} is not JSON: {exc}") from None
        if not isinstance(decoded, dict):
            raise Unavailable(f"the answer to {method} {path} is not a JSON object")
        return decoded

    # -- objects ------------------------------------------------------

    def get(self, res: paths.Resource, *, name: str, namespace: str | None = None) -> Obj:
        return self.request("GET", res.path(namespace=namespace, name=name))

    def create(self, res: paths.Resource, obj: Obj, *, namespace: str | None = None) -> Obj:
        body = {"apiVersion": res.api_version, "kind": res.kind, **obj}
        return self.request("POST", res.path(namespace=namespace), body=body)

    def replace(self, res: paths.Resource, obj: Obj, *, subresource: str | None = None,
                field_manager: str | None = None) -> Obj:
        """PUT the object back; its metadata.resourceVersion is the precondition.
        `field_manager` names the writer in managedFields (default: the user agent)."""
        meta = obj["metadata"]
        if not meta.get("resourceVersion"):
            raise ValueError("replace needs the resourceVersion read: a blind write is not allowed")
        path = res.path(namespace=meta.get("namespace"), name=meta["name"], sub=subresource)
        query: Query | None = [("fieldManager", field_manager)] if field_manager else None
        return self.request("PUT", path, query=query, body=obj)

    def merge_patch(
        self, res: paths.Resource, patch: Obj, *, name: str, namespace: str | None = None, subresource: str | None = None,
        field_manager: str | None = None,
    ) -> Obj:
        """A JSON merge patch. A metadata.resourceVersion in PATCH is a precondition (409 when the
        object moved on); a merge patch replaces a list whole, so one that sends a list needs it."""
        path = res.path(namespace=namespace, name=name, sub=subresource)
        query: Query | None = [("fieldManager", field_manager)] if field_manager else None
        return self.request("PATCH", path, query=query, body=patch, content_type="application/merge-patch+json")

    def delete(self, res: paths.Resource, *, name: str, namespace: str | None = None,
               body: Obj | None = None, missing_ok: bool = False) -> None:
        """DELETE, with an optional DeleteOptions `body` (propagation, preconditions).
        With `missing_ok`, a 404 is done; a failed uid precondition is a Conflict."""
        try:
            self.request("DELETE", res.path(namespace=namespace, name=name), body=body)
        except NotFound:
            if not missing_ok:
                raise

    def pages(self, res: paths.Resource, *, namespace: str | None = None, label_selector: str | None = None,
              field_selector: str | None = None, limit: int = 500) -> Iterator[Obj]:
        """The list's pages (each the apiserver's answer), `limit` items at a time:
        a large list never sits in memory whole."""
        query: Query = [("limit", str(limit)), *_selectors(label_selector, field_selector)]
        while True:
            page = self.request("GET", res.path(namespace=namespace), query=query)
            yield page
            cont = (page.get("metadata") or {}).get("continue")
            if not cont:
                return
            query = [q for q in query if q[0] != "continue"] + [("continue", str(cont))]

    def each(self, res: paths.Resource, *, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None, limit: int = 500) -> Iterator[Obj]:
        """The list's items, fetched a page of `limit` at a time."""
        for page in self.pages(res, namespace=namespace, label_selector=label_selector,
                               field_selector=field_selector, limit=limit):
            yield from page.get("items") or []

    def list(self, res: paths.Resource, *, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None) -> tuple[list[Obj], str]:
        """All items (paged) and the list's resourceVersion."""
        items: list[Obj] = []
        meta: Obj = {}
        for page in self.pages(res, namespace=namespace, label_selector=label_selector,
                               field_selector=field_selector):
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
        return items, str(meta.get("resourceVersion") or "")

    def read_log(self, *, namespace: str, pod: str, container: str, tail_lines: int) -> str:
        """The last `tail_lines` lines of a container's log (pods/log), as text."""
        path = paths.POD.path(namespace=namespace, name=pod, sub="log")
        data = self.raw("GET", path, query=[("container", container), ("tailLines", str(tail_lines))])
        return data.decode(errors="replace")

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
        A 410, as a status or as an ERROR event, raises Gone; a dropped
        stream raises Unavailable.
        """
        query: Query = [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
            *_selectors(label_selector, field_selector),
        ]
        timeout = urllib3.Timeout(connect=TIMEOUT[0], read=timeout_seconds + 30)
        resp = self._send("GET", res.path(namespace=namespace), query=query, timeout=timeout, stream=True)
        try:
            if not 200 <= resp.status <= 299:
                raise error(resp.status, resp.read())
            for line in kubernetes.watch.watch.iter_resp_lines(resp):
                if not line or line.isspace():
                    continue
                try:
                    event = json.loads(line)
                except ValueError as exc:
                    raise Unavailable(f"a watch line is not JSON: {exc}") from None
                kind, obj = event.get("type", ""), event.get("object") or {}
                if kind == "ERROR":
                    raise error(int(obj.get("code") or 500), json.dumps(obj))
                yield kind, obj
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise _transport_error(exc) from None
        finally:
            resp.release_conn()

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
        field_manager: str | None = None,
        on_written: Callable[[Obj], None] | None = None,
    ) -> tuple[T, int]:
        """Read, compute, write preconditioned on the read; on 409 read again.

        `compute(obj)` returns (new object or None for "nothing to write",
        a result). It is called on every fresh read, so the written value is
        always derived from the version it is preconditioned on. `first` is
        an already-read copy to start from (an informer's): it is only a
        hint, a conflict sends us back to the server. `on_written` gets the
        object the server returned for the write that landed. Returns the
        result of the compute whose write landed and the number of
        conflicts retried.
        """
        conflicts = 0
        obj = first if first is not None else self.get(res, name=name, namespace=namespace)
        while True:
            new, result = compute(obj)
            if new is None:
                return result, conflicts
            try:
                written = self.replace(res, new, subresource=subresource, field_manager=field_manager)
                if on_written is not None:
                    on_written(written)
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
        return self.event(involved=involved, reason=reason, message=message, component=component, type_="Warning")

    def event(self, *, involved: Obj, reason: str, message: str, component: str, type_: str = "Normal") -> Obj:
        """An Event of `type_` (Normal or Warning) on `involved` (an object read from the server)."""
        event = events.body(involved=involved, reason=reason, message=message, component=component, type_=type_)
        return self.create(paths.EVENT, event, namespace=involved["metadata"]["namespace"])


def from_api_client(api_client: Any) -> Client:
    return Client(api_client)
