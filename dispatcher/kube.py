"""The one module that speaks to the Kubernetes API (raw JSON, no models).

Everything else handles plain dicts. The calls made for every run (create a
Job, create a Secret, list pods, get and delete) go out through `_rest`: the
kubernetes client's own connection pool (its TLS and proxy settings) and its
own credentials (`get_api_key_with_prefix`, which refreshes an in-cluster or
exec token as the client does), but no generated method: those validate each
argument with pydantic and walk the body to serialize it, about a third of
the dispatcher's CPU per request. The rarer calls (list and watch Jobs,
Events, logs) use the typed methods with `_preload_content=False`; every
answer is parsed with `json.loads`, never into models.

Connections are reused: every answer's body is read to its end (also when it
is not needed), so its connection goes back to the pool; an unread body
closes it, and the next request pays a new TLS handshake. There is no
client-side QPS limit (the kubernetes Python client has none): the number of
requests in flight is bounded by the dispatcher's workers, and the
apiserver's own priority and fairness queues the rest.

Errors come back as `ApiError` (with `.status`) or `Unavailable` (no answer:
connection refused, reset, timeout). Nothing here retries: the caller owns
the backoff, because only it knows whether a retry is safe (a create is
retried as a create, whose AlreadyExists is the answer).

`requests` counts the calls, for the benchmark's "API requests per run".
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import kubernetes.config
import kubernetes.watch.watch
import urllib3

Obj = dict[str, Any]

TIMEOUT = (5.0, 30.0)  # connect, read


class Unavailable(Exception):
    """The apiserver did not answer."""


class ApiError(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status}: {reason}")
        self.status = status
        self.reason = reason


def _error(e: kubernetes.client.ApiException) -> ApiError:
    reason = str(e.reason or "")
    try:
        reason = json.loads(e.body or "{}").get("message") or reason
    except (ValueError, AttributeError):
        pass
    return ApiError(int(e.status or 0), reason)


def _seg(value: str) -> str:
    """A name as one path segment."""
    return urllib.parse.quote(value, safe="")


class Kube:
    def __init__(self, *, kubeconfig: str = "", pool_size: int = 16) -> None:
        configuration = kubernetes.client.Configuration()
        if kubeconfig:
            kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        else:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        configuration.retries = False
        configuration.connection_pool_maxsize = pool_size
        self.api = kubernetes.client.ApiClient(configuration)
        self.configuration = configuration
        self._pool = self.api.rest_client.pool_manager
        self._timeout = urllib3.Timeout(connect=TIMEOUT[0], read=TIMEOUT[1])
        self.batch = kubernetes.client.BatchV1Api(self.api)
        self.core = kubernetes.client.CoreV1Api(self.api)
        self.requests = 0

    def close(self) -> None:
        self.api.close()

    def _call(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        self.requests += 1
        kwargs.setdefault("_request_timeout", TIMEOUT)
        try:
            response = method(*args, _preload_content=False, **kwargs)
        except kubernetes.client.ApiException as e:
            raise _error(e) from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise Unavailable(f"{type(e).__name__}: {e}") from None
        return response

    def _rest(self, method: str, path: str, *, query: dict[str, Any] | None = None,
              body: Obj | None = None) -> Obj:
        """One request on the client's pool with its credentials; the answer's JSON (read whole)."""
        self.requests += 1
        headers = {**self.api.default_headers, "Accept": "application/json", "User-Agent": self.api.user_agent}
        token = self.configuration.get_api_key_with_prefix("BearerToken")
        if token:
            headers["Authorization"] = token
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        url = self.configuration.host + path
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v not in (None, "")})
        try:
            response = self._pool.request(method, url, body=data, headers=headers, timeout=self._timeout,
                                          retries=False, preload_content=True)
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise Unavailable(f"{type(e).__name__}: {e}") from None
        if not 200 <= response.status < 300:
            reason = str(response.reason or "")
            try:
                reason = json.loads(response.data or b"{}").get("message") or reason
            except (ValueError, AttributeError):
                pass
            raise ApiError(response.status, reason)
        try:
            return dict(json.loads(response.data or b"{}"))
        except ValueError as e:
            raise Unavailable(f"the answer to {method} {path} is not JSON: {e}") from None

    def _json(self, method: Any, *args: Any, **kwargs: Any) -> Obj:
        response = self._call(method, *args, **kwargs)
        try:
            return dict(json.loads(response.data))
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise Unavailable(f"{type(e).__name__}: {e}") from None

    # -- Jobs and Secrets ---------------------------------------------------

    def create_job(self, namespace: str, body: Obj) -> Obj:
        return self._rest("POST", f"/apis/batch/v1/namespaces/{_seg(namespace)}/jobs", body=body)

    def get_job(self, namespace: str, name: str) -> Obj:
        return self._rest("GET", f"/apis/batch/v1/namespaces/{_seg(namespace)}/jobs/{_seg(name)}")

    def list_jobs(self, namespace: str, *, selector: str, limit: int = 500, cont: str | None = None) -> Obj:
        kwargs: dict[str, Any] = {"label_selector": selector, "limit": limit}
        if cont:
            kwargs["_continue"] = cont
        return self._json(self.batch.list_namespaced_job, namespace, **kwargs)

    def watch_jobs(self, namespace: str, *, selector: str, resource_version: str,
                   timeout_seconds: int) -> Iterator[Obj]:
        """Raw watch events ({"type", "object"}) until the server ends the watch."""
        response = self._call(
            self.batch.list_namespaced_job, namespace, label_selector=selector, watch=True,
            resource_version=resource_version, allow_watch_bookmarks=True,
            timeout_seconds=timeout_seconds, _request_timeout=(TIMEOUT[0], timeout_seconds + 15),
        )
        try:
            for line in kubernetes.watch.watch.iter_resp_lines(response):
                if line and not line.isspace():
                    yield json.loads(line)
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise Unavailable(f"watch: {type(e).__name__}: {e}") from None
        finally:
            response.close()
            response.release_conn()

    def delete_job(self, namespace: str, name: str, *, uid: str = "") -> None:
        """Delete a Job and (in the background) its pods; its Secret goes with it. 404 is done.

        With `uid`, only that Job: another Job of the same name answers 409 (a precondition failed).
        """
        body: Obj = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self._rest("DELETE", f"/apis/batch/v1/namespaces/{_seg(namespace)}/jobs/{_seg(name)}", body=body)
        except ApiError as e:
            if e.status != 404:
                raise

    def create_secret(self, namespace: str, body: Obj) -> Obj:
        return self._rest("POST", f"/api/v1/namespaces/{_seg(namespace)}/secrets", body=body)

    def get_secret(self, namespace: str, name: str) -> Obj:
        return self._rest("GET", f"/api/v1/namespaces/{_seg(namespace)}/secrets/{_seg(name)}")

    # -- Pods, logs, Events -------------------------------------------------

    def list_pods(self, namespace: str, *, selector: str) -> list[Obj]:
        return list(self.iter_pods(namespace, selector=selector))

    def iter_pods(self, namespace: str, *, selector: str, field_selector: str = "",
                  page: int = 100) -> Iterator[Obj]:
        """The pods of a list, fetched `page` at a time: a large list never sits in memory whole."""
        query: dict[str, Any] = {"labelSelector": selector, "fieldSelector": field_selector, "limit": page}
        while True:
            answer = self._rest("GET", f"/api/v1/namespaces/{_seg(namespace)}/pods", query=query)
            yield from answer.get("items") or []
            query["continue"] = (answer.get("metadata") or {}).get("continue")
            if not query["continue"]:
                return

    def delete_pod(self, namespace: str, name: str) -> None:
        try:
            self._rest("DELETE", f"/api/v1/namespaces/{_seg(namespace)}/pods/{_seg(name)}")
        except ApiError as e:
            if e.status != 404:
                raise

    def read_log(self, namespace: str, pod: str, *, container: str, tail_lines: int) -> str:
        response = self._call(self.core.read_namespaced_pod_log, pod, namespace, container=container,
                              tail_lines=tail_lines)
        return bytes(response.data).decode(errors="replace")

    def list_events(self, namespace: str, *, field_selector: str) -> list[Obj]:
        return list(self._json(self.core.list_namespaced_event, namespace,
                               field_selector=field_selector).get("items") or [])
