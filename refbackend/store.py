"""The run table in SQLite, and the atomic claim.

States: pending -> claimed -> running -> succeeded | failed | cancelled.
The claim is one `UPDATE ... RETURNING` inside `BEGIN IMMEDIATE`, so two
concurrent callers can never take the same run: SQLite serializes writers,
and the row the statement picks is changed by the same statement.

Per-harness maximum parallelism: a pending run is claimable only while its
harness has fewer than `max_parallel` runs claimed or running. A claimed run
whose lease expired (its dispatcher died before the driver said "running")
is offered again; it already holds its harness slot. The dispatcher's Job
name is derived from the run id, so offering a run again cannot make a
second Job.

Game jams: a run enqueued with a `jam` and a `model` is claimable only
while no run of the same (jam, model) is claimed or running, under any
harness, and no earlier run of that pair is still pending: a model's jam
entries run one at a time, in enqueue order (each is briefed with the
previous one's README). A claimed run whose lease expired still holds its
jam slot, as it holds its harness slot, until it is offered again. Both
rules are in the one statement that makes the claim, so two claimers (two
threads, two server processes on one file) cannot both pass them.

Per-job tokens are minted at enqueue (secrets.token_urlsafe). They are
stored as they are: this is a stand-in, and the claim must hand them out.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
import uuid
from typing import Any

TERMINAL = ("succeeded", "failed", "cancelled")
STATES = ("running", *TERMINAL)

SCHEMA = """
CREATE TABLE IF NOT EXISTS harnesses (name TEXT PRIMARY KEY, max_parallel INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT UNIQUE NOT NULL,
  harness TEXT NOT NULL,
  launch_request TEXT NOT NULL,
  token TEXT NOT NULL,
  state TEXT NOT NULL DEFAULT 'pending',
  claims INTEGER NOT NULL DEFAULT 0,
  lease_until REAL,
  enqueued_at REAL NOT NULL,
  jam TEXT,
  model TEXT
);
CREATE INDEX IF NOT EXISTS runs_state ON runs (state, seq);
CREATE INDEX IF NOT EXISTS runs_harness ON runs (harness, state);
CREATE TABLE IF NOT EXISTS reports (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  run_id TEXT NOT NULL,
  state TEXT NOT NULL,
  body TEXT NOT NULL,
  at REAL NOT NULL
);
"""

# Created after the columns exist (a database from before jams gets them by ALTER TABLE first).
JAM_INDEX = "CREATE INDEX IF NOT EXISTS runs_jam ON runs (jam, model, state, seq)"

# The one statement that decides and takes a claim. A row is offered when it is
# - a claimed run whose lease expired (it already holds its harness and jam slots), or
# - a pending run that passes both rules:
#   harness: its harness has no limit, or fewer than max_parallel runs claimed or running;
#   jam:     it has no jam, or no run of its (jam, model) is claimed or running (any harness)
#            and none enqueued before it is still pending.
# and of those, the first enqueued. Each kind is looked for on its own, in enqueue order along
# the (state, seq) index, stopping at the first that passes: a queue of thousands costs a claim
# only the rows it has to skip, not a sort of all of them.
CLAIM = """
UPDATE runs SET state = 'claimed', claims = claims + 1, lease_until = :lease
WHERE seq = (SELECT min(seq) FROM (
  SELECT seq FROM (
    SELECT r.seq FROM runs r WHERE r.state = 'claimed' AND r.lease_until < :now ORDER BY r.seq LIMIT 1)
  UNION ALL
  SELECT seq FROM (
    SELECT r.seq FROM runs r LEFT JOIN harnesses h ON h.name = r.harness
    WHERE r.state = 'pending'
      AND (h.max_parallel IS NULL OR
           (SELECT count(*) FROM runs x WHERE x.harness = r.harness AND x.state IN ('claimed', 'running'))
           < h.max_parallel)
      AND (r.jam IS NULL OR NOT EXISTS (
           SELECT 1 FROM runs y WHERE y.jam = r.jam AND y.model = r.model
           AND (y.state IN ('claimed', 'running') OR (y.state = 'pending' AND y.seq < r.seq))))
    ORDER BY r.seq LIMIT 1)))
RETURNING id, token, launch_request, harness, claims, jam, model
"""


class Store:
    def __init__(self, path: str, *, lease_seconds: float) -> None:
        self.path = path
        self.lease_seconds = lease_seconds
        self._local = threading.local()
        db = self._db()
        db.executescript(SCHEMA)
        columns = {row["name"] for row in db.execute("PRAGMA table_info(runs)")}
        for column in ("jam", "model"):
            if column not in columns:  # a database made before jams existed
                db.execute(f"ALTER TABLE runs ADD COLUMN {column} TEXT")
        db.execute(JAM_INDEX)
        db.execute("CREATE INDEX IF NOT EXISTS runs_token ON runs (token)")

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=True)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.row_factory = sqlite3.Row
            self._local.db = db
        return db

    def set_harness(self, name: str, *, max_parallel: int) -> None:
        self._db().execute("INSERT INTO harnesses (name, max_parallel) VALUES (?, ?) "
                           "ON CONFLICT (name) DO UPDATE SET max_parallel = excluded.max_parallel",
                           (name, max_parallel))

    def enqueue(self, *, harness: str, launch_request: Any, run_id: str | None = None,
                jam: str | None = None, model: str | None = None) -> dict[str, str] | None:
        """The new run's id and token; None when a run with that id exists already."""
        run_id = run_id or uuid.uuid4().hex
        token = secrets.token_urlsafe(24)
        try:
            self._db().execute(
                "INSERT INTO runs (id, harness, launch_request, token, enqueued_at, jam, model) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (run_id, harness, json.dumps(launch_request), token, time.time(), jam, model))
        except sqlite3.IntegrityError:
            return None
        return {"id": run_id, "token": token}

    def known_token(self, token: str) -> bool:
        """Whether this is some run's per-job token (a caller holding one may learn which ids exist)."""
        return self._db().execute("SELECT 1 FROM runs WHERE token = ?", (token,)).fetchone() is not None

    def claim(self) -> dict[str, Any] | None:
        db = self._db()
        now = time.time()
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute(CLAIM, {"now": now, "lease": now + self.lease_seconds}).fetchone()
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        if row is None:
            return None
        return {"id": row["id"], "token": row["token"], "launch_request": json.loads(row["launch_request"]),
                "harness": row["harness"], "claims": row["claims"], "jam": row["jam"], "model": row["model"]}

    def report(self, run_id: str, *, token: str, state: str, body: Any,
               service: bool = False) -> tuple[int, str | None]:
        """(200, None) accepted; else the refusal: 404 unknown run, 401 wrong token, 409 already terminal,
        or 409 `running` for a run nobody claimed (a run is in flight only by a claim, or the jam
        and harness rules could be walked around). SERVICE: the caller holds the service token (the
        dispatcher refusing a run whose own token it must not send), which stands for any run's."""
        db = self._db()
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute("SELECT token, state FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                answer: tuple[int, str | None] = (404, "unknown run")
            elif not service and not secrets.compare_digest(row["token"].encode(), token.encode()):
                answer = (401, "wrong job token")
            elif row["state"] in TERMINAL:
                answer = (409, "run already terminal")
            elif state == "running" and row["state"] == "pending":
                answer = (409, "run is not claimed: only a claimed run can be running")
            else:
                db.execute("UPDATE runs SET state = ?, lease_until = NULL WHERE id = ?", (state, run_id))
                db.execute("INSERT INTO reports (run_id, state, body, at) VALUES (?, ?, ?, ?)",
                           (run_id, state, json.dumps(body), time.time()))
                answer = (200, None)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return answer

    def get(self, run_id: str) -> dict[str, Any] | None:
        db = self._db()
        row = db.execute("SELECT id, harness, jam, model, state, claims FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            return None
        reports = [{"state": r["state"], "body": json.loads(r["body"])} for r in
                   db.execute("SELECT state, body FROM reports WHERE run_id = ? ORDER BY seq", (run_id,))]
        return {**dict(row), "reports": reports}

    def runs(self) -> list[dict[str, Any]]:
        rows = self._db().execute("SELECT id, harness, jam, model, state, claims FROM runs ORDER BY seq")
        return [dict(r) for r in rows]
