"""Leader election on a Lease: one leader at a time, and a leader that cannot renew steps down in
time.

The client library's election with its Lease lock, made safe in three ways the controller needs
(docs/adapter.md, "Operating the controller"):
- An apiserver it cannot reach (a connection refused or reset, a timeout: what a restart of
  kube-apiserver shows) is a failed try, as an error answer is (`_UnreachableIsAFailedTry`): the
  library's lock catches only error answers, and anything else would end its thread.
- Every Lease call is bounded, connecting included, by `lease_call_timeout`
  (min(retry period, renew deadline / 2)), on an ApiClient of its own over the caller's
  configuration, with no urllib3 retries (`_LeaseApi`, `_lease_api_client`): a renewal never
  waits behind the workers' requests or on a connection whose packets are dropped.
- The term ends at most the renew deadline after the start of the last renewal that succeeded,
  even while a Lease call is blocked: a watchdog beside the renew loop calls `on_stopped`
  (`_StepsDownInTime`).

It never acts for the leader: it only calls `on_started` and `on_stopped`, and returns after
`on_stopped` has run. The Lease is the only object it reads or writes.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import kubernetes.client
import kubernetes.leaderelection.electionconfig
import kubernetes.leaderelection.leaderelection
import kubernetes.leaderelection.resourcelock.leaselock
import urllib3

from toolkit import kube

log = logging.getLogger(__name__)


class _UnreachableIsAFailedTry(kubernetes.leaderelection.resourcelock.leaselock.LeaseLock):
    """The library's Lease lock, for which an apiserver it cannot reach (a connection refused or
    reset, a timeout: what a restart of kube-apiserver shows) is a failed try, as an error answer
    is. The library catches only ApiException: anything else escaped its loop and ended the
    leader-election thread, so a standby never campaigned again, and a leader went on acting
    without renewing its Lease (`on_stopped` never called) while another replica took it over."""

    def get(self, name: str, namespace: str) -> tuple[bool, Any]:
        try:
            return super().get(name, namespace)
        except (urllib3.exceptions.HTTPError, OSError) as e:
            return False, kubernetes.client.ApiException(status=0, reason=f"unreachable: {e}")

    def create(self, name: str, namespace: str, election_record: Any) -> bool:
        try:
            return bool(super().create(name, namespace, election_record))
        except (urllib3.exceptions.HTTPError, OSError):
            return False

    def update(self, name: str, namespace: str, updated_record: Any) -> bool:
        try:
            return bool(super().update(name, namespace, updated_record))
        except (urllib3.exceptions.HTTPError, OSError):
            return False


def lease_call_timeout(*, renew_deadline: float, retry_period: float) -> float:
    """Seconds one Lease call may take, connecting included: min(retry period, renew deadline / 2).
    A try is two calls (a read, then an update or a create), so it ends within the renew deadline,
    and a call waits no longer than the pause between tries; a Lease call answers in milliseconds
    from a healthy apiserver."""
    return min(float(retry_period), renew_deadline / 2)


class _LeaseApi(kubernetes.client.CoordinationV1Api):
    """The three Lease calls the lock makes, each carrying `timeout` as its `_request_timeout`
    (the generated methods send none by default, and a connection whose packets are dropped would
    hold a renewal forever)."""

    def __init__(self, api_client: kubernetes.client.ApiClient, *, timeout: float) -> None:
        super().__init__(api_client)
        self.timeout = timeout

    def read_namespaced_lease(self, name: str, namespace: str, **kwargs: Any) -> Any:
        return super().read_namespaced_lease(name, namespace, _request_timeout=self.timeout, **kwargs)

    def create_namespaced_lease(self, namespace: str, body: Any, **kwargs: Any) -> Any:
        return super().create_namespaced_lease(namespace, body, _request_timeout=self.timeout, **kwargs)

    def replace_namespaced_lease(self, name: str, namespace: str, body: Any, **kwargs: Any) -> Any:
        return super().replace_namespaced_lease(name=name, namespace=namespace, body=body,
                                                _request_timeout=self.timeout, **kwargs)


def _lease_api_client(configuration: kubernetes.client.Configuration) -> kubernetes.client.ApiClient:
    """An ApiClient of its own for the Lease, over the same Configuration (host, TLS, credentials
    and their refresh): its connection never waits behind the workers' requests in the shared
    pool, and urllib3 retries nothing on it (its default retries a timed-out read three times,
    each with the whole timeout again, which would let one call outlast the renew deadline)."""
    api_client = kubernetes.client.ApiClient(configuration)
    # The pools are made on first use from these keywords, so this reaches every one of them.
    api_client.rest_client.pool_manager.connection_pool_kw["retries"] = False
    return api_client


class _StepsDownInTime(kubernetes.leaderelection.leaderelection.LeaderElection):
    """The library's election, with a term that ends when its deadline passes.

    The library checks its renew deadline only between tries, and counts it from the end of the
    pause after a renewal: a try blocked in a call (an apiserver whose packets are dropped) holds
    the term open for as long as the call lasts, past the moment a standby takes the Lease.
    Here the deadline counts from the start of the last try that renewed (the renewTime it wrote
    is no earlier, so a standby's lease duration runs from no earlier either), and a watchdog
    thread ends the term when it passes, whatever the election thread is blocked in: `on_stopped`
    starts at most the renew deadline after that start, plus the watchdog's wake-up (milliseconds).
    It is called once, by whichever of the two threads gets there first; the election thread
    returns only after it has run, so a campaign that follows never overlaps it. A try that
    renews after the term ended does not revive it. Each call is bounded too (`_LeaseApi`), so
    the election thread itself returns within about two calls of the deadline."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._renewed_at = 0.0  # time.monotonic() at the start of the last try that renewed
        self._ended = threading.Event()
        self._ending = threading.Lock()
        self._stopped = False

    def try_acquire_or_renew(self) -> bool:
        started = time.monotonic()
        renewed = bool(super().try_acquire_or_renew())
        if renewed and not self._ended.is_set():
            self._renewed_at = started
        return renewed

    def run(self) -> None:
        self.acquire()  # returns once the Lease is ours: it tries every retry period until then
        leading_failed = threading.Event()
        watchdog = threading.Thread(target=self._watch_deadline, name="lease-deadline", daemon=True)
        watchdog.start()
        threading.Thread(target=self.run_onstarted_leading, args=(leading_failed,), daemon=True).start()
        try:
            self.renew_loop(leading_failed)
        finally:
            self._end()
            watchdog.join()

    def renew_loop(self, leading_failed: threading.Event | None = None) -> None:
        retry_period = self.election_config.retry_period
        renew_deadline = self.election_config.renew_deadline
        while not self._ended.wait(retry_period):
            if leading_failed is not None and leading_failed.is_set():
                return  # on_started raised: the Lease protects nothing any more
            if self.try_acquire_or_renew():
                continue
            if time.monotonic() >= self._renewed_at + renew_deadline:
                return

    def _watch_deadline(self) -> None:
        renew_deadline = self.election_config.renew_deadline
        while True:
            left = self._renewed_at + renew_deadline - time.monotonic()
            if left <= 0:
                log.warning("the Lease was not renewed within the renew deadline: stepping down",
                            extra={"lease": self.election_config.lock.name, "renew_deadline": renew_deadline})
                self._end()
                return
            if self._ended.wait(left):
                return

    def _end(self) -> None:
        self._ended.set()
        with self._ending:
            if self._stopped:
                return
            self._stopped = True
            self.election_config.onstopped_leading()


def run_leader_election(
    client: kube.Client,
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
    leading and `on_stopped` (once) when the term ends: at most `renew_deadline`
    seconds after the start of the last renewal that succeeded, even while a
    Lease call is blocked (`_StepsDownInTime`). Returns after `on_stopped` has run.

    Uses the client library's leader election with a Lease lock; the lock calls
    the apiserver through an ApiClient of its own over `client`'s configuration
    (`_lease_api_client`), each call bounded by `lease_call_timeout`.
    """
    lock = _UnreachableIsAFailedTry(
        lease_name, namespace, identity or f"{os.environ.get('HOSTNAME', 'controller')}-{uuid.uuid4().hex[:8]}"
    )
    api_client = _lease_api_client(client.configuration)
    lock.api_instance = _LeaseApi(
        api_client, timeout=lease_call_timeout(renew_deadline=renew_deadline, retry_period=retry_period))
    config = kubernetes.leaderelection.electionconfig.Config(
        lock, lease_duration, renew_deadline, retry_period, on_started, on_stopped
    )
    try:
        _StepsDownInTime(config).run()
    finally:
        api_client.close()
