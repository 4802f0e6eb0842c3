"""Leader election outlives an apiserver it cannot reach.

The client library's Lease lock catches only the apiserver's error answers; a connection refused
(what a restart of kube-apiserver shows its clients) used to escape its loop and end the election
thread: a standby never campaigned again, and a leader kept acting without renewing its Lease.
Here the apiserver is a port nobody listens on: the election must keep trying, never lead, and
still be trying after several retry periods.
"""

from __future__ import annotations

import pathlib
import socket
import threading
import time

import yaml

from toolkit import clusterconfig, leader


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_refused_connection_is_a_failed_try_and_the_election_goes_on(tmp_path: pathlib.Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "gone",
        "clusters": [{"name": "gone", "cluster": {"server": f"https://127.0.0.1:{_closed_port()}",
                                                   "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "u"}}]}))
    client = clusterconfig.load(kubeconfig=str(kubeconfig), retries=0)
    led, errors = threading.Event(), []

    def run() -> None:
        try:
            leader.run_leader_election(client, lease_name="l", namespace="ns", on_started=led.set,
                                     on_stopped=led.set, lease_duration=4, renew_deadline=3, retry_period=1)
        except BaseException as e:  # noqa: BLE001 (what ended the thread is the finding)
            errors.append(e)

    elector = threading.Thread(target=run, daemon=True)
    elector.start()
    time.sleep(4.5)  # four retry periods, every one refused
    assert errors == [] and elector.is_alive(), errors
    assert not led.is_set()
