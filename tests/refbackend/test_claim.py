"""The reference backend's claim: atomic under concurrent callers, limits, leases, status answers."""

from __future__ import annotations

import collections
import concurrent.futures
import time
import urllib.request

from tests.refbackend import proc


def test_many_concurrent_claimers_never_get_the_same_run() -> None:
    with proc.Backend() as backend:
        ids = {backend.enqueue(harness=f"h{i % 3}")["id"] for i in range(300)}

        def claimer(_: int) -> list[str]:
            got = []
            while True:
                code, body = backend.call("POST", "/jobs/next")
                if code == 204:
                    return got
                assert code == 200, (code, body)
                got.append(body["id"])

        with concurrent.futures.ThreadPoolExecutor(max_workers=24) as pool:
            claimed = [i for part in pool.map(claimer, range(24)) for i in part]
        counts = collections.Counter(claimed)
        assert [i for i, n in counts.items() if n > 1] == []
        assert set(claimed) == ids


def test_per_harness_limit_holds_the_rest_pending_until_a_slot_frees() -> None:
    with proc.Backend() as backend:
        assert backend.call("PUT", "/harnesses/small", {"max_parallel": 2})[0] == 200
        runs = [backend.enqueue(harness="small") for _ in range(4)]
        other = backend.enqueue(harness="other")
        first = [backend.call("POST", "/jobs/next")[1]["id"] for _ in range(3)]
        assert first == [runs[0]["id"], runs[1]["id"], other["id"]]
        assert backend.call("POST", "/jobs/next")[0] == 204
        assert backend.call("POST", f"/jobs/{runs[0]['id']}/status", {"status": "succeeded"},
                            token=runs[0]["token"])[0] == 200
        assert backend.call("POST", "/jobs/next")[1]["id"] == runs[2]["id"]


def test_a_claim_that_never_started_is_offered_again_after_its_lease() -> None:
    with proc.Backend(lease=0.5) as backend:
        run = backend.enqueue()
        assert backend.call("POST", "/jobs/next")[1]["id"] == run["id"]
        assert backend.call("POST", "/jobs/next")[0] == 204
        time.sleep(0.7)
        again = backend.call("POST", "/jobs/next")[1]
        assert (again["id"], again["token"], again["claims"]) == (run["id"], run["token"], 2)
        assert backend.call("POST", f"/jobs/{run['id']}/status", {"status": "running"}, token=run["token"])[0] == 200
        time.sleep(0.7)
        assert backend.call("POST", "/jobs/next")[0] == 204


def test_status_answers_unknown_wrong_token_terminal_and_bad_state() -> None:
    with proc.Backend() as backend:
        run = backend.enqueue()
        path = f"/jobs/{run['id']}/status"
        assert backend.call("POST", "/jobs/nope/status", {"status": "failed"}, token=run["token"])[0] == 404
        assert backend.call("POST", path, {"status": "failed"}, token="wrong")[0] == 401
        assert backend.call("POST", path, {"status": "exploded"}, token=run["token"])[0] == 400
        assert backend.call("POST", path, {"status": "failed", "error": {"x": 1}}, token=run["token"])[0] == 200
        assert backend.call("POST", path, {"status": "failed"}, token=run["token"])[0] == 409
        assert [r["state"] for r in backend.get(run["id"])["reports"]] == ["failed"]


def test_the_service_token_stands_for_a_run_s_own_on_a_status_report() -> None:
    # The dispatcher refuses a run whose own token it must never send, with the service token.
    with proc.Backend() as backend:
        run = backend.enqueue()
        assert backend.call("POST", "/jobs/next")[0] == 200
        path = f"/jobs/{run['id']}/status"
        refusal = {"status": "failed", "error": {"reason": "InvalidJobToken"}}
        assert backend.call("POST", path, refusal, token=backend.token)[0] == 200
        assert backend.get(run["id"])["state"] == "failed"
        assert backend.call("POST", path, {"status": "failed"}, token=backend.token)[0] == 409  # terminal stays
        assert backend.call("POST", "/jobs/nope/status", refusal, token=backend.token)[0] == 404


def test_service_token_is_checked() -> None:
    with proc.Backend() as backend:
        backend.enqueue()
        assert backend.call("POST", "/jobs/next", token="wrong")[0] == 401
        assert backend.call("POST", "/jobs", {"harness": "h"}, token="")[0] == 401
        request = urllib.request.Request(backend.url + "/jobs/next", data=b"", method="POST")
        try:
            urllib.request.urlopen(request, timeout=10)
            raise AssertionError("no token was accepted")
        except urllib.error.HTTPError as e:
            assert e.code == 401


def test_a_run_nobody_claimed_cannot_say_running_but_can_be_cancelled() -> None:
    # "running" only follows a claim: otherwise a driver could put a run in flight past the
    # harness limit and the jam rule, which are checked at the claim.
    with proc.Backend() as backend:
        run, other = backend.enqueue(), backend.enqueue()
        code, body = backend.call("POST", f"/jobs/{run['id']}/status", {"status": "running"}, token=run["token"])
        assert (code, body["error"]) == (409, "run is not claimed: only a claimed run can be running")
        assert backend.get(run["id"]) == {**backend.get(run["id"]), "state": "pending", "reports": []}
        backend.report(other, "cancelled")
        assert backend.get(other["id"])["state"] == "cancelled"
        assert backend.call("POST", "/jobs/next")[1]["id"] == run["id"]


def test_an_enqueue_with_an_unknown_field_is_400_naming_it() -> None:
    with proc.Backend() as backend:
        code, body = backend.call("POST", "/jobs", {"harness": "h", "jam": "j", "modle": "m"})
        assert code == 400 and body["error"].startswith("unknown field 'modle'"), body
        assert backend.runs() == []
