"""A leader whose Lease update never answers steps down within the renew deadline.

The apiserver is a real local socket (`holding_apiserver`) that creates the Lease, answers its
reads, and takes the leader's updates without ever answering them: what a leader sees of an
apiserver whose packets are dropped. A standby takes the Lease a lease duration after it last saw
it renewed, so the leader must have stopped by then: `on_stopped` is called at most the renew
deadline (plus SLACK) after the last renewal that was answered, while the update is still held,
and the election itself returns once the held call's timeout ends it. While renewals are
answered, the term goes on past several renew deadlines.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import kubernetes.client
import pytest

from tests.controller import holding_apiserver
from tests.controller.conftest import wait_until
from toolkit import kube, leader

SLACK = 0.5  # the watchdog's wake-up on a loaded machine; it is milliseconds on an idle one
LEASE = holding_apiserver.LEASES.format(namespace="ns") + "/l"


@pytest.fixture
def apiserver() -> Iterator[holding_apiserver.HoldingApiserver]:
    server = holding_apiserver.HoldingApiserver().start()
    yield server
    server.close()


class Term:
    """One run of `leader.run_leader_election` in a thread, with the times its callbacks ran."""

    def __init__(self, server: holding_apiserver.HoldingApiserver, *, lease_duration: int, renew_deadline: int,
                 retry_period: int) -> None:
        self.server = server
        self.client = kube.Client(kubernetes.client.ApiClient(kubernetes.client.Configuration(host=server.url)),
                                  retries=0)
        self.started = threading.Event()
        self.stopped: list[float] = []  # time.monotonic() of each on_stopped
        self.returned: list[float] = []
        self.errors: list[BaseException] = []
        self.options = {"lease_duration": lease_duration, "renew_deadline": renew_deadline,
                        "retry_period": retry_period}
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _on_stopped(self) -> None:
        self.stopped.append(time.monotonic())

    def _run(self) -> None:
        try:
            leader.run_leader_election(self.client, lease_name="l", namespace="ns", identity="leader",
                                     on_started=self.started.set, on_stopped=self._on_stopped, **self.options)
        except BaseException as e:  # noqa: BLE001 (what ended the thread is the finding)
            self.errors.append(e)
        finally:
            self.returned.append(time.monotonic())

    def start(self) -> Term:
        self.thread.start()
        return self

    def close(self) -> None:
        self.thread.join(30)
        self.client.close()


def test_the_call_timeout_keeps_a_try_within_the_renew_deadline():
    assert leader.lease_call_timeout(renew_deadline=10, retry_period=2) == 2
    assert leader.lease_call_timeout(renew_deadline=5, retry_period=3) == 2.5
    assert leader.lease_call_timeout(renew_deadline=2, retry_period=1) == 1


def test_an_update_that_never_answers_ends_the_term_within_the_renew_deadline(apiserver):
    # The create is answered, every update is held. With a 5 s deadline and 3 s between tries, the
    # first renewal (3 s after the create) is still waiting on its update when the deadline passes:
    # the term must end then, not when that call gives up (2.5 s after it started).
    apiserver.hold = lambda method, path: method == "PUT"
    term = Term(apiserver, lease_duration=6, renew_deadline=5, retry_period=3).start()
    try:
        assert term.started.wait(10), apiserver.requests
        wait_until(lambda: term.returned, what="the election to return", timeout=15)
    finally:
        term.close()
    assert term.errors == []
    assert len(term.stopped) == 1, term.stopped
    created = apiserver.lease_writes[-1]
    assert len(apiserver.lease_writes) == 1, "no update may have been answered"
    assert 5 - SLACK <= term.stopped[0] - created <= 5 + SLACK, term.stopped[0] - created
    # The client waits for the held update until its timeout, 2.5 s after sending it: the term
    # ended within that wait, and the election returned when the wait ended.
    update = apiserver.arrivals("PUT", LEASE)[0]
    assert update < term.stopped[0] < update + 2.5, (update, term.stopped[0])
    assert term.returned[0] - update <= 2.5 + SLACK, term.returned[0] - update


def test_a_leader_whose_renewals_are_answered_keeps_leading_until_they_are_held(apiserver):
    term = Term(apiserver, lease_duration=4, renew_deadline=3, retry_period=1).start()
    try:
        assert term.started.wait(10), apiserver.requests
        time.sleep(4.5)  # one and a half renew deadlines, a renewal every second
        assert term.stopped == [] and term.returned == []
        assert len(apiserver.lease_writes) >= 4, apiserver.lease_writes  # the create, then renewals
        apiserver.hold = lambda method, path: method == "PUT"
        wait_until(lambda: term.stopped, what="the term to end", timeout=10)
        last = apiserver.lease_writes[-1]
        assert 3 - SLACK <= term.stopped[0] - last <= 3 + SLACK, term.stopped[0] - last
        wait_until(lambda: term.returned, what="the election to return", timeout=10)
    finally:
        term.close()
    assert term.errors == [] and len(term.stopped) == 1
