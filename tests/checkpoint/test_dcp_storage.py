"""The fence as DCP's storage layer (dispatch_fence.dcp_storage.Writer, dispatch_fence.dcp_reader.Reader)
under torch.distributed.checkpoint.save, async_save and load themselves, with real torch on CPU:
two gloo ranks started by torchrun (tests/checkpoint/fixtures/dcp_storage_worker.py), a tensor
sharded across them, into a POSIX root, an s3:// root on the local S3 server and a gs:// root on
the GCS emulator; the requests counted and timed by the proxy in front of the store
(tests/checkpoint/proxy.py).

- a save publishes, a load restores bit for bit, and a superseded execution's save is refused
  on every rank before it writes anything
- a load reads, on each rank, only the byte ranges torch's own load planner asks that rank for,
  each by a ranged GET, and nothing of a data file whole
- an async save returns before its upload begins, whole training steps run while each rank's
  file goes up, and LATEST is written only after every rank's upload ended
- an async save overtaken by a newer execution between its claim and its publish is refused on
  every rank, and leaves nothing under the root of an object store
- bad input to the writer and the reader is one line naming the field

At the lowest versions the `dcp` extra allows (torch 2.4, devcluster/build-torch-venv.sh lowest)
only the tests of the API that differs between the ends run, each on one root: save, load and
refusal (POSIX), a load's ranged reads and an async save's upload beside training (S3), bad input.
The races are the fence's own and the stores are not torch's: they run at the pinned end only,
which keeps the suite's time at the lowest end to a few torchrun starts.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import re
import subprocess
import urllib.parse
from collections.abc import Iterator

import pytest

from devcluster import objectstores
from dispatch_fence import checkpoint
from tests.checkpoint import kit, proxy, stores
from tests.checkpoint import torchrun as runner

WORKER = kit.REPO / "tests" / "checkpoint" / "fixtures" / "dcp_storage_worker.py"


@pytest.fixture(autouse=True)
def _torchrun_temp_under_the_test(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun leaves a directory per run under TMPDIR: under the test's own temporary directory."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))


@pytest.fixture(params=["s3", "gcs"])
def store(request: pytest.FixtureRequest) -> objectstores.Server:
    server: objectstores.Server = request.getfixturevalue(request.param)
    return server


@contextlib.contextmanager
def proxy_before(store: objectstores.Server) -> Iterator[tuple[objectstores.Server, proxy.Proxy, dict[str, str]]]:
    """(the server, a proxy in front of it, the client environment that goes through the proxy)."""
    key = "AWS_ENDPOINT_URL" if "AWS_ENDPOINT_URL" in store.env else "STORAGE_EMULATOR_HOST"
    with proxy.Proxy(store.env[key].removeprefix("http://"), drop=lambda method, target: False) as p:
        yield store, p, {**store.env, key: f"http://{p.address}"}


@pytest.fixture
def proxied(store: objectstores.Server) -> Iterator[tuple[objectstores.Server, proxy.Proxy, dict[str, str]]]:
    with proxy_before(store) as found:
        yield found


def torchrun(python: str, env: dict[str, str], *args: str, epoch: int | None = None,
             attempt: str = "") -> subprocess.Popen[str]:
    return runner.start(python, WORKER, env, *args, epoch=epoch, attempt=attempt)


finish = runner.finish


def said(lines: list[str], what: str) -> dict[int, str]:
    """rank -> the rest of its line `rank R: WHAT ...`."""
    found = (re.fullmatch(rf"rank (\d): {what} (.*)", line) for line in lines)
    return {int(m.group(1)): m.group(2) for m in found if m}


def refusals(err: str) -> list[str]:
    return sorted(line for line in err.splitlines() if line.startswith("rank ") and "refused" in line)


def saved(name: str) -> list[str]:
    return [f"rank {r}: saved; LATEST names {name}" for r in (0, 1)]


def loaded(name: str) -> list[str]:
    return [f"rank {r}: loaded {name} bit-exact" for r in (0, 1)]


def refused(epoch: int, fence: int, name: str, root: str) -> list[str]:
    return [f"rank {r}: refused: epoch {epoch} is lower than epoch {fence} ({name}) in {root}: a superseded "
            "execution's save, refused; nothing published" for r in (0, 1)]


def test_a_save_publishes_a_load_restores_and_a_superseded_save_is_refused_on_every_rank(
        torch_python: str, where: tuple[str, objectstores.Server | None]) -> None:
    saved_loaded_refused(torch_python, *where)


def test_at_the_lowest_versions_a_save_publishes_a_load_restores_and_a_superseded_save_is_refused(
        torch_lowest_python: str, tmp_path: pathlib.Path) -> None:
    saved_loaded_refused(torch_lowest_python, str(tmp_path / "root"), None)


def saved_loaded_refused(python: str, root: str, server: objectstores.Server | None) -> None:
    env = server.env if server else {}
    code, lines, err = finish(torchrun(python, env, "save", root, epoch=5, attempt="j.1.0.2.0"))
    name = checkpoint.name_of(5, 1, "j.1.0.2.0")
    assert (code, lines) == (0, saved(name)), err[-3000:]
    code, lines, err = finish(torchrun(python, env, "load", root, "5"))
    assert (code, [line for line in lines if "loaded" in line]) == (0, loaded(name)), err[-3000:]
    code, lines, err = finish(torchrun(python, env, "save", root, epoch=4, attempt="j.1.0.1.0"))
    assert (code, lines, refusals(err)) == (1, [], refused(4, 5, name, root)), err[-3000:]
    # Refused in the global plan, before any rank wrote: no claim, no staging directory.
    if server is not None:
        assert not [k for k in stores.tree(server, root) if "-j.1.0.1.0/" in k]
        assert stores.latest(server, root).name == name
    else:
        assert sorted(p.name for p in pathlib.Path(root).iterdir()) == [".lock", "LATEST", name]


def ranges_of(log: list[proxy.Logged]) -> list[tuple[str, int, int]]:
    """(data file, start, length) of every GET of a DCP data file; AssertionError for one not ranged."""
    out = []
    for r in log:
        found = re.search(r"(__\d+_0\.distcp)", r.target)
        if r.method != "GET" or not found:
            continue
        assert r.range is not None, f"{r.target} was read whole"
        first, last = map(int, re.fullmatch(r"bytes=(\d+)-(\d+)", r.range).groups())  # type: ignore[union-attr]
        out.append((found.group(1), first, last - first + 1))
    return out


def covered(spans: list[tuple[str, int, int]]) -> set[tuple[str, int]]:
    """Every (file, byte) the spans cover."""
    return {(f, b) for f, start, length in spans for b in range(start, start + length)}


def test_each_rank_reads_only_the_byte_ranges_its_load_plan_asks_for(
        torch_python: str, proxied: tuple[objectstores.Server, proxy.Proxy, dict[str, str]]) -> None:
    reads_its_ranges_only(torch_python, *proxied)


def test_at_the_lowest_versions_each_rank_reads_only_the_byte_ranges_its_load_plan_asks_for(
        torch_lowest_python: str, s3: objectstores.Server) -> None:
    with proxy_before(s3) as proxied:
        reads_its_ranges_only(torch_lowest_python, *proxied)


def reads_its_ranges_only(python: str, server: objectstores.Server, p: proxy.Proxy, env: dict[str, str]) -> None:
    root = server.root()
    code, lines, err = finish(torchrun(python, server.env, "save", root, "--rows", "4096", epoch=5,
                                       attempt="j.1.0.1.0"))
    assert code == 0, err[-3000:]
    code, lines, err = finish(torchrun(python, env, "load", root, "5", "--rows", "4096"))
    assert (code, [line for line in lines if "loaded" in line]) == (0, loaded(checkpoint.name_of(5, 1, "j.1.0.1.0"))), \
        err[-3000:]
    needs = {r: [tuple(n) for n in json.loads(v)] for r, v in said(lines, "needs").items()}
    reads = ranges_of(p.log)
    # Every byte read is one some rank's plan asks for, each rank's bytes are read once, and no more.
    assert covered(reads) == covered(needs[0]) | covered(needs[1])
    assert sum(n for _, _, n in reads) == len(covered(needs[0])) + len(covered(needs[1]))
    # Each rank skips the other's half of the sharded tensor: far from every rank reading every file.
    sizes = {f: max(s + n for g, s, n in needs[0] + needs[1] if g == f) for f, _, _ in reads}
    assert sum(n for _, _, n in reads) < 0.75 * 2 * sum(sizes.values()), (reads, sizes)


def uploads_of(log: list[proxy.Logged], key: str) -> list[proxy.Logged]:
    """The writes of KEY: named in the target (S3, a GCS resumable session's start) or in the body (a
    GCS upload of one request), and a resumable session's later requests."""
    named = [r for r in log if r.method in ("PUT", "POST") and (
        key in urllib.parse.unquote(r.target) or key.encode() in r.body)]
    sessions = {m.group(1) for r in named if (m := re.search(r"upload_id=([^&]+)", r.target))}
    return [r for r in log if r in named or any(f"upload_id={s}" in r.target for s in sessions)]


def test_an_async_save_uploads_while_training_steps_run_and_publishes_after_every_rank(
        torch_python: str, proxied: tuple[objectstores.Server, proxy.Proxy, dict[str, str]]) -> None:
    uploads_beside_training(torch_python, *proxied)


def test_at_the_lowest_versions_an_async_save_uploads_while_training_steps_run_and_publishes_after_every_rank(
        torch_lowest_python: str, s3: objectstores.Server) -> None:
    with proxy_before(s3) as proxied:
        uploads_beside_training(torch_lowest_python, *proxied)


def uploads_beside_training(python: str, server: objectstores.Server, p: proxy.Proxy, env: dict[str, str]) -> None:
    root = server.root()
    rows = str(96 * 1024)  # 12 MiB of the sharded tensor on each rank
    code, lines, err = finish(torchrun(python, env, "async", root, "--rows", rows, epoch=6,
                                       attempt="j.1.0.2.0"))
    name = checkpoint.name_of(6, 1, "j.1.0.2.0")
    assert (code, [line for line in lines if "saved" in line]) == (0, saved(name)), err[-3000:]
    events = {r: json.loads(v) for r, v in said(lines, "events").items()}
    latest = uploads_of(p.log, "/LATEST")
    assert len(latest) == 1, [(r.target, r.body[:300]) for r in p.log]
    for rank in (0, 1):
        ups = uploads_of(p.log, f"{name}/__{rank}_0.distcp")
        assert ups, [r.target for r in p.log]
        start, end = min(u.started for u in ups), max(u.ended for u in ups)
        steps = events[rank]["steps"]
        # async_save returned (the state staged) before this rank's upload began ...
        assert events[rank]["returned"] < start, (events[rank]["returned"], start, end)
        # ... a whole training step ran while it went up ...
        assert [s for s in steps if start <= s[0] and s[1] <= end], (start, end, steps[:5], steps[-5:])
        # ... and LATEST went up only after it (and every other rank's) had landed.
        assert latest[0].started > end
    code, lines, err = finish(torchrun(python, server.env, "load", root, "6", "--rows", rows))
    assert (code, [line for line in lines if "loaded" in line]) == (0, loaded(name)), err[-3000:]


wait_for = runner.wait_for


def test_an_async_save_overtaken_between_its_claim_and_its_publish_is_refused_on_every_rank(
        torch_python: str, where: tuple[str, objectstores.Server | None], tmp_path: pathlib.Path) -> None:
    root, server = where
    env = server.env if server else {}
    gate = tmp_path / "gate"
    old = torchrun(torch_python, env, "async", root, "--gate", str(gate), epoch=5, attempt="j.1.0.1.0")
    try:
        wait_for([pathlib.Path(f"{gate}.started.{r}") for r in (0, 1)], old)  # planned and claimed; not written
        code, lines, err = finish(torchrun(torch_python, env, "save", root, epoch=6, attempt="j.1.0.2.0"))
        assert code == 0, err[-3000:]
    finally:
        gate.touch()
    name = (stores.latest(server, root) if server else checkpoint.latest(root)).name
    assert name.startswith(checkpoint.name_of(6, 0, "x")[:25])
    code, lines, err = finish(old)
    assert (code, [line for line in lines if "saved" in line], refusals(err)) == (1, [], refused(5, 6, name, root)), \
        err[-3000:]
    if server is not None:
        assert not [k for k in stores.tree(server, root) if "-j.1.0.1.0/" in k]
    else:
        assert [c.epoch for c in checkpoint.checkpoints(root)] == [6]
    code, lines, err = finish(torchrun(torch_python, env, "load", root, "6"))
    assert (code, [line for line in lines if "loaded" in line]) == (0, loaded(name)), err[-3000:]


BAD_INPUT = r"""
import os, sys
from torch.distributed.checkpoint.planner import SavePlan
from dispatch_fence import dcp_reader, dcp_storage, model
top = sys.argv[1]
junk, empty = (os.path.join(top, f"ckpt-0000000000000000001-00000{n}-a") for n in (1, 2))
for d in (junk, empty):
    os.makedirs(d)
open(os.path.join(junk, ".metadata"), "wb").write(b"junk")
cases = [
    lambda: dcp_storage.Writer("ftp://bucket/x", epoch=1, attempt="a"),
    lambda: dcp_storage.Writer("/ckpt", keep=0, epoch=1, attempt="a"),
    lambda: dcp_storage.Writer("/ckpt", epoch="01", attempt="a"),
    lambda: dcp_storage.Writer("/ckpt", attempt="a"),
    lambda: dcp_storage.Writer(3, epoch=1, attempt="a"),
    lambda: dcp_storage.Writer(epoch=1, attempt="a").set_up_storage_writer(True),
    lambda: dcp_storage.Writer("/ckpt", epoch=1, attempt="a").set_up_storage_writer(True, use_collectives=False),
    lambda: dcp_storage.Writer("/ckpt", epoch=1, attempt="a").write_data(SavePlan([]), None),
    lambda: dcp_reader.Reader("s3://").read_metadata(),
    lambda: dcp_reader.Reader(top).read_metadata(),
    lambda: dcp_reader.Reader().read_metadata(),
    lambda: dcp_reader.Reader(junk).read_metadata(),
    lambda: dcp_reader.Reader(empty).read_metadata(),
]
for case in cases:
    try:
        case()
        print("accepted")
    except model.CheckpointError as exc:
        print(f"{type(exc).__name__}: {exc}")
"""


@pytest.mark.parametrize("end", ["pinned", "lowest"])
def test_bad_input_to_the_writer_and_the_reader_is_one_line_naming_the_field(
        end: str, request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> None:
    python: str = request.getfixturevalue("torch_python" if end == "pinned" else "torch_lowest_python")
    env = {**objectstores.clean_env(), "PYTHONPATH": str(kit.REPO / "fence")}
    top = tmp_path / "root"
    out = subprocess.run([python, "-c", BAD_INPUT, str(top)], env=env, capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    junk, empty = (top / f"ckpt-0000000000000000001-00000{n}-a" for n in (1, 2))
    assert out.stdout.splitlines() == [
        "BadInput: root ftp://bucket/x: the scheme 'ftp' is not one of s3://, gs://",
        "BadInput: keep = 0 must be an int >= 1 (or None: keep every checkpoint)",
        "BadInput: epoch = '01' is not a canonical decimal (digits, no sign, no leading zero)",
        "BadInput: DISPATCH_EPOCH is not set: run under the dispatch prologue, or pass epoch=",
        "BadInput: root must be a path or an s3:// or gs:// URL, found int",
        "BadInput: root: give Writer(root) or checkpoint_id= to save",
        "BadInput: use_collectives=False: the fence publishes once, after every rank wrote",
        "BadInput: the save plan carries no target of this writer: was another writer's plan used?",
        "BadInput: root s3:// names no bucket",
        f"BadInput: {top} holds no checkpoint yet (no LATEST): nothing to load",
        "BadInput: where: give Reader(where) or checkpoint_id= to load",
        f"CorruptRoot: {junk}/.metadata is not DCP metadata: UnpicklingError",
        f"CorruptRoot: {empty}/.metadata: cannot read: No such file or directory",
    ]
