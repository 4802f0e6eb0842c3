"""A leader that loses its Lease stops acting and campaigns again in the same process.

Another candidate takes the Lease (the test writes it as a second replica would, renewing it
every half second) and keeps it: the leader, unable to renew, stops its work and becomes a
standby without exiting; an admission reserved meanwhile is neither raised nor approved. Once the
rival stops renewing, the same process takes the Lease back and approves it, with a raise.
"""

from __future__ import annotations

import datetime
import threading
import time

import pytest

from tests.adapter import kit
from tests.controller.conftest import wait_until
from toolkit import kube, paths, raising

pytestmark = pytest.mark.cluster

LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/dispatch-controller"


def _rival(admin: kube.Client, namespace: str, stop: threading.Event) -> None:
    """Hold the Lease as another replica: holder "rival", renewed every half second."""
    path = LEASES.format(namespace=namespace)
    while not stop.is_set():
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        try:
            lease = admin.request("GET", path)
            lease["spec"] = {**lease["spec"], "holderIdentity": "rival", "renewTime": now, "acquireTime": now}
            admin.request("PUT", path, body=lease)
        except kube.Conflict:
            pass  # the leader renewed in between: take it on the next round
        stop.wait(0.5)


def test_a_leader_that_lost_its_lease_acts_on_nothing_then_leads_again_without_exiting(
        admin, namespace, start_controller):
    check = f"dispatch-{namespace[-8:]}"
    kit.create_admission_check(admin, check)
    ctl = start_controller()
    assert ctl.get("/leaderz")[0] == 200

    stop = threading.Event()
    rival = threading.Thread(target=_rival, args=(admin, namespace, stop), daemon=True)
    rival.start()
    try:
        wait_until(lambda: any(line.get("message") == "lost the lease, campaigning again" for line in ctl.lines),
                   what="the lost lease logged", timeout=20)
        assert ctl.proc.poll() is None, ctl.log_tail()
        assert ctl.get("/leaderz")[0] != 200
        assert ctl.get("/readyz")[0] == 200  # a standby is ready

        tj = kit.create_trainjob(admin, namespace)
        wl = kit.create_workload(admin, tj)
        kit.kueue_reserve(admin, namespace=namespace, name=wl["metadata"]["name"], check=check)
        time.sleep(4)  # more than the lease's 3 s: a leader would have approved it by now
        entry = kit.check_entry(admin, namespace=namespace, name=wl["metadata"]["name"], check=check)
        assert entry.get("state") == "Pending", entry
        now = admin.get(paths.TRAINJOB, name=tj["metadata"]["name"], namespace=namespace)
        assert raising.counts(now).current == 0
    finally:
        stop.set()
        rival.join(5)

    entry = wait_until(lambda: (e := kit.check_entry(admin, namespace=namespace, name=wl["metadata"]["name"],
                                                       check=check)).get("state") == "Ready" and e,
                       what="Ready from the next term", timeout=30)
    assert entry["message"] == "A raised to 1"
    assert ctl.proc.poll() is None, ctl.log_tail()
    assert [line["message"] for line in ctl.lines if line.get("message") in ("leading", "ready")] == [
        "leading", "ready", "leading", "ready"], ctl.log_tail()
    assert ctl.get("/leaderz")[0] == 200
