"""Game-jam runs: a model's entries in one jam run one at a time, in enqueue order, under any harness.

A run enqueued with a `jam` and a `model` is claimable only while no other run
of that (jam, model) is claimed or running, whatever its harness, and only
when no earlier run of the same pair is still pending. Proven over real HTTP
on the real SQLite file, with claimers in threads, in processes, and against
two server processes sharing one database.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import random
import time
from typing import Any

import pytest

from tests.refbackend import proc


def claim(backend: proc.Backend) -> dict[str, Any] | None:
    code, body = backend.call("POST", "/jobs/next")
    assert code in (200, 204), (code, body)
    return body if code == 200 else None


def test_a_jam_entry_waits_while_another_of_the_same_jam_and_model_is_in_flight_under_any_harness() -> None:
    with proc.Backend() as backend:
        first = backend.enqueue(harness="a", jam="spring", model="m1")
        second = backend.enqueue(harness="b", jam="spring", model="m1")  # another harness: still held
        other_model = backend.enqueue(harness="a", jam="spring", model="m2")
        other_jam = backend.enqueue(harness="b", jam="autumn", model="m1")
        plain = backend.enqueue(harness="a")
        got = [claim(backend) for _ in range(4)]
        assert [g["id"] for g in got if g] == [first["id"], other_model["id"], other_jam["id"], plain["id"]]
        assert (got[0]["jam"], got[0]["model"]) == ("spring", "m1")
        assert got[3]["jam"] is None and got[3]["model"] is None
        assert claim(backend) is None
        # Running still holds the slot; the end of the run frees it.
        backend.report(first, "running")
        assert claim(backend) is None
        backend.report(first, "succeeded")
        assert claim(backend)["id"] == second["id"]
        assert backend.get(second["id"])["jam"] == "spring"


@pytest.mark.parametrize("end", ["succeeded", "failed", "cancelled"])
def test_every_terminal_state_frees_the_jam_slot(end: str) -> None:
    with proc.Backend() as backend:
        runs = [backend.enqueue(jam="j", model="m") for _ in range(2)]
        assert claim(backend)["id"] == runs[0]["id"]
        assert claim(backend) is None
        backend.report(runs[0], end)
        assert claim(backend)["id"] == runs[1]["id"]


def test_the_order_within_a_jam_is_enqueue_order_even_when_the_first_entry_waits_for_its_harness() -> None:
    with proc.Backend() as backend:
        assert backend.call("PUT", "/harnesses/busy", {"max_parallel": 1})[0] == 200
        blocker = backend.enqueue(harness="busy")
        assert claim(backend)["id"] == blocker["id"]
        first = backend.enqueue(harness="busy", jam="j", model="m")  # its harness is full
        second = backend.enqueue(harness="free", jam="j", model="m")  # its harness is free, but it is second
        unrelated = backend.enqueue(harness="free")
        assert claim(backend)["id"] == unrelated["id"]
        assert claim(backend) is None
        backend.report(blocker, "succeeded")
        assert claim(backend)["id"] == first["id"]
        assert claim(backend) is None
        backend.report(first, "failed")
        assert claim(backend)["id"] == second["id"]


def test_the_harness_limit_and_the_jam_rule_compose() -> None:
    with proc.Backend() as backend:
        assert backend.call("PUT", "/harnesses/h", {"max_parallel": 1})[0] == 200
        a1 = backend.enqueue(harness="x", jam="j", model="a")
        a2 = backend.enqueue(harness="h", jam="j", model="a")
        b1 = backend.enqueue(harness="h")
        assert claim(backend)["id"] == a1["id"]
        # The harness would allow a2, the jam does not: b1 (enqueued later) goes first and fills the harness.
        assert claim(backend)["id"] == b1["id"]
        assert claim(backend) is None
        backend.report(a1, "succeeded")
        # Now the jam would allow a2, the harness does not.
        assert claim(backend) is None
        backend.report(b1, "succeeded")
        assert claim(backend)["id"] == a2["id"]


def test_a_run_whose_claim_lease_expired_keeps_its_jam_slot_until_it_is_offered_again() -> None:
    with proc.Backend(lease=0.5) as backend:
        first = backend.enqueue(jam="j", model="m")
        second = backend.enqueue(jam="j", model="m")
        assert claim(backend)["id"] == first["id"]
        time.sleep(0.7)  # the lease is over: nobody said "running"
        assert backend.get(second["id"])["state"] == "pending"
        # Many claimers at once: the expired run goes to exactly one; nobody gets the second entry.
        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            answers = list(pool.map(lambda _: claim(backend), range(8)))
        taken = [a for a in answers if a]
        assert [(a["id"], a["claims"]) for a in taken] == [(first["id"], 2)]
        time.sleep(0.7)  # expired again: still only the first entry is offered
        assert claim(backend)["id"] == first["id"]
        backend.report(first, "running")
        time.sleep(0.7)  # a running run has no lease: it holds the slot however long it runs
        assert claim(backend) is None
        backend.report(first, "succeeded")
        assert claim(backend)["id"] == second["id"]


@pytest.mark.parametrize("body, field", [
    ({"harness": "h", "jam": "j"}, "model"),
    ({"harness": "h", "model": "m"}, "jam"),
    ({"harness": "h", "jam": "", "model": "m"}, "jam"),
    ({"harness": "h", "jam": "j", "model": 3}, "model"),
    ({"harness": "h", "jam": ["j"], "model": "m"}, "jam"),
    ({"harness": "h", "jam": "j" * 300, "model": "m"}, "jam"),
])
def test_jam_and_model_come_both_or_neither_as_strings(body: dict[str, Any], field: str) -> None:
    with proc.Backend() as backend:
        before = backend.dump()
        code, answer = backend.call("POST", "/jobs", body)
        assert code == 400 and answer["error"].startswith(field), answer
        assert backend.dump() == before


# --- concurrent claimers: the invariant never breaks -----------------------------------------------------------

JAMS = [(f"jam{j}", f"model{m}") for j in range(3) for m in range(3)]


def enqueue_mix(backend: proc.Backend, *, per_pair: int, plain: int) -> dict[str, tuple[str, str]]:
    """Interleaved jam entries (several harnesses) and plain runs; run id -> (jam, model) or ("", "")."""
    pairs: dict[str, tuple[str, str]] = {}
    rng = random.Random(7)
    work = [pair for pair in JAMS for _ in range(per_pair)] + [("", "")] * plain
    rng.shuffle(work)
    for i, (jam, model) in enumerate(work):
        extra = {"jam": jam, "model": model} if jam else {}
        pairs[backend.enqueue(harness=f"h{i % 3}", **extra)["id"]] = (jam, model)
    return pairs


def claim_and_run(url: str, token: str, hold: float) -> list[tuple[str, float, float]]:
    """Claim until nothing is left; hold each run for `hold` s, then end it. (id, claimed, ending) per run.

    `claimed` is read after the claim's answer and `ending` before the terminal report is sent, on
    CLOCK_MONOTONIC (one clock for every process), so two runs whose windows overlap were in flight
    at the backend at the same time.
    """
    backend = proc.Client(url, token)
    done: list[tuple[str, float, float]] = []
    idle_since = None
    while True:
        code, body = backend.call("POST", "/jobs/next")
        if code == 204:
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since > 1.0:  # others may still be ending runs that free jam slots
                return done
            time.sleep(0.01)
            continue
        assert code == 200, (code, body)
        idle_since = None
        claimed = time.monotonic()
        run = {"id": body["id"], "token": body["token"]}
        backend.report(run, "running")
        time.sleep(hold)
        ending = time.monotonic()
        backend.report(run, random.choice(["succeeded", "failed"]))
        done.append((body["id"], claimed, ending))


def check_one_at_a_time(pairs: dict[str, tuple[str, str]], done: list[tuple[str, float, float]]) -> None:
    assert sorted(i for i, _, _ in done) == sorted(pairs), "a run was lost or run twice"
    by_pair: dict[tuple[str, str], list[tuple[float, float, str]]] = {}
    for run_id, claimed, ending in done:
        if pairs[run_id][0]:
            by_pair.setdefault(pairs[run_id], []).append((claimed, ending, run_id))
    assert len(by_pair) == len(JAMS)
    order = list(pairs)
    for pair, windows in by_pair.items():
        windows.sort()
        for (_, ended, a), (started, _, b) in zip(windows, windows[1:]):
            assert ended < started, f"{pair}: {b} was claimed while {a} was in flight"
        ids = [w[2] for w in windows]
        assert ids == sorted(ids, key=order.index), f"{pair}: not in enqueue order"


def test_concurrent_claimer_threads_never_hold_two_runs_of_one_jam_and_model() -> None:
    with proc.Backend() as backend:
        pairs = enqueue_mix(backend, per_pair=6, plain=30)
        with concurrent.futures.ThreadPoolExecutor(max_workers=12) as pool:
            parts = list(pool.map(lambda _: claim_and_run(backend.url, backend.token, 0.01), range(12)))
        check_one_at_a_time(pairs, [d for part in parts for d in part])


def test_claimer_processes_on_two_servers_over_one_database_never_hold_two_runs_of_one_jam_and_model() -> None:
    with proc.Backend() as first:
        with proc.Backend(db=first.db_path) as second:  # a second server process on the same SQLite file
            pairs = enqueue_mix(first, per_pair=5, plain=20)
            context = multiprocessing.get_context("spawn")
            with concurrent.futures.ProcessPoolExecutor(max_workers=6, mp_context=context) as pool:
                futures = [pool.submit(claim_and_run, (first, second)[i % 2].url, first.token, 0.01)
                           for i in range(6)]
                done = [d for f in futures for d in f.result(timeout=300)]
            check_one_at_a_time(pairs, done)
            assert {r["state"] for r in second.runs()} <= {"succeeded", "failed"}


def test_a_database_made_before_jams_gains_the_columns_and_keeps_its_runs(tmp_path: Any) -> None:
    import sqlite3
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE harnesses (name TEXT PRIMARY KEY, max_parallel INTEGER NOT NULL);
        CREATE TABLE runs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, harness TEXT NOT NULL,
          launch_request TEXT NOT NULL, token TEXT NOT NULL, state TEXT NOT NULL DEFAULT 'pending',
          claims INTEGER NOT NULL DEFAULT 0, lease_until REAL, enqueued_at REAL NOT NULL);
        INSERT INTO runs (id, harness, launch_request, token, enqueued_at) VALUES ('old', 'h', '{}', 'tok-old', 0);
    """)
    db.commit()
    db.close()
    with proc.Backend(db=str(path)) as backend:
        entry = backend.enqueue(jam="j", model="m")
        assert [claim(backend)["id"], claim(backend)["id"]] == ["old", entry["id"]]
        assert backend.get("old")["jam"] is None
