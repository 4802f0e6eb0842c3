"""Large files, streams and retries on the real servers (versitygw for S3,
fake-gcs-server for GCS; devcluster/objectstores.py), with a part threshold of
5 MiB so that a file of 12 MiB goes up in three parts (docs/checkpoint.md,
"Large files, streams and retries"). Every publish is a real process; where a
test must see or disturb the requests, a small proxy of the test's own sits
between the publisher and the server (tests/checkpoint/proxy.py).

- a file above the threshold goes up in parts (S3: a multipart upload, its
  parts and the completion that carries If-None-Match: *; GCS: a resumable
  upload in chunks) and is published whole
- create-only holds for a file in parts: the completion over an existing object
  is refused, the upload aborted, the object as it was, no parts left
- a stale execution's multipart upload is refused at publish: no visible object
  and no upload left on the server (S3 lists them)
- a part that cannot go up aborts its upload: exit 2, one line, no parts left
- a response lost and the request retried by the client (the claim, a file of
  the checkpoint, the probe's object, a multipart completion, a resumable
  upload's last chunk): the publish succeeds; a retried create that finds
  another's object is not taken for its own, and what went up alongside that
  claim never appears under the other's name
- every store error is one line: a store that is down, no credentials, bad
  settings
"""

from __future__ import annotations

import hashlib
import pathlib
import re
import subprocess
import sys
from collections.abc import Callable

import pytest

from devcluster import objectstores
from dispatch_fence import aws, checkpoint
from tests.checkpoint import kit, proxy, stores

MiB = 1024 * 1024
PARTS = {"DISPATCH_CHECKPOINT_PART_THRESHOLD": str(5 * MiB), "DISPATCH_CHECKPOINT_PART_SIZE": str(5 * MiB)}
BIG = 12 * MiB + 3  # three parts of 5, 5 and 2 MiB


def staging(parent: pathlib.Path, token: str) -> pathlib.Path:
    """kit.staging's files, and big.bin of BIG bytes (its content from TOKEN)."""
    path = kit.staging(parent, token, complete=False)
    block = hashlib.sha256(token.encode()).digest() * (MiB // 32)
    with open(path / "big.bin", "wb") as f:
        for _ in range(12):
            f.write(block)
        f.write(b"end")
    (path / checkpoint.MARKER).write_text("")
    return path


def files_of(path: pathlib.Path) -> dict[str, str]:
    """Every file of a staging directory: relative path -> sha256."""
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def published(server: objectstores.Server, root: str, name: str) -> dict[str, str]:
    tree = stores.tree(server, root)
    return {k[len(name) + 1:]: hashlib.sha256(v).hexdigest() for k, v in tree.items() if k.startswith(name + "/")}


def upstream(server: objectstores.Server) -> str:
    return (server.env.get("AWS_ENDPOINT_URL") or server.env["STORAGE_EMULATOR_HOST"]).removeprefix("http://")


def through(server: objectstores.Server, p: proxy.Proxy) -> dict[str, str]:
    """SERVER's client environment, its endpoint the proxy, and the small parts."""
    key = "AWS_ENDPOINT_URL" if "AWS_ENDPOINT_URL" in server.env else "STORAGE_EMULATOR_HOST"
    return {**server.env, key: f"http://{p.address}", **PARTS}


def publish(env: dict[str, str], staging_dir: pathlib.Path, root: str, epoch: int,
            attempt: str) -> tuple[int, str, str]:
    out = subprocess.run([sys.executable, "-m", "dispatch_fence", "publish", str(staging_dir), root, "--epoch",
                          str(epoch), "--attempt", attempt], env={**objectstores.clean_env(), **env},
                         capture_output=True, text=True, timeout=300, cwd=kit.REPO, check=False)
    return out.returncode, out.stdout, out.stderr


def uploads(server: objectstores.Server, root: str) -> list[tuple[str, str]]:
    """The multipart uploads under ROOT the S3 server still holds (ListMultipartUploads); none on GCS,
    whose resumable sessions are not listed (they expire)."""
    if server.scheme != "s3":
        return []
    return list(stores.open_store(server, root).uploads())


def never(method: str, target: str) -> bool:
    return False


def test_a_file_above_the_threshold_goes_up_in_parts_and_is_published(server: objectstores.Server,
                                                                      tmp_path: pathlib.Path) -> None:
    root = server.root()
    src = staging(tmp_path, "a")
    with proxy.Proxy(upstream(server), drop=never) as p:
        code, out, err = publish(through(server, p), src, root, 5, "j.1.0.1.0")
        requests = list(p.requests)
    name = checkpoint.name_of(5, 1, "j.1.0.1.0")
    assert (code, out, err) == (0, f"{root}/{name}\n", "")
    assert published(server, root, name) == files_of(src)
    big = re.escape(f"{name}/big.bin".replace("/", "%2F") if server.scheme == "gs" else f"{name}/big.bin")
    if server.scheme == "s3":
        assert [r for r in requests if re.search(big + r"\?uploads$", r)] == [f"POST /ckpt/{root[10:]}/{name}/big.bin?uploads"]
        assert sorted(re.search(r"partNumber=(\d+)", r).group(1) for r in requests  # type: ignore[union-attr]
                      if re.search(big + r"\?partNumber=", r)) == ["1", "2", "3"]
        assert len([r for r in requests if r.startswith("POST ") and re.search(big + r"\?uploadId=", r)]) == 1
        assert not [r for r in requests if r.startswith("PUT ") and re.search(big + "$", r)]  # never one PUT
        assert uploads(server, root) == []
    else:
        assert len([r for r in requests if "uploadType=resumable" in r and r.startswith("POST ")]) == 1
        assert len([r for r in requests if r.startswith("PUT ") and "upload_id=" in r]) == 3  # three chunks


def test_a_file_in_parts_is_created_only_if_absent(server: objectstores.Server, tmp_path: pathlib.Path) -> None:
    root = server.root()
    store = stores.open_store(server, root, PARTS)
    src = staging(tmp_path, "a") / "big.bin"
    other = staging(tmp_path / "b", "b") / "big.bin"
    store.create("x/big.bin", str(src))
    with pytest.raises(Exception) as refused:
        store.create("x/big.bin", str(other))
    assert type(refused.value).__name__ == "Exists"
    assert hashlib.sha256(store.read("x/big.bin")).digest() == hashlib.sha256(src.read_bytes()).digest()
    assert uploads(server, root) == []  # the refused upload was aborted, its parts with it


def test_a_stale_executions_upload_in_parts_is_refused_and_leaves_nothing(server: objectstores.Server,
                                                                          tmp_path: pathlib.Path) -> None:
    root = server.root()
    old = stores.Publisher(staging(tmp_path / "old", "old"), root, epoch=3, attempt="j.1.0.1.0",
                           env={**server.env, **PARTS})
    # S3: stopped with every part up and the completion not sent; GCS: fenced, nothing sent yet.
    old.run_to("multipart" if server.scheme == "s3" else "fenced")
    if server.scheme == "s3":
        assert [k for k, _ in uploads(server, root)] == [f"{checkpoint.name_of(3, 1, 'j.1.0.1.0')}/big.bin"]
    new_src = staging(tmp_path / "new", "new")
    code, _, err = publish({**server.env, **PARTS}, new_src, root, 4, "j.1.0.2.0")
    assert code == 0, err
    code, out, err = old.finish()
    new = checkpoint.name_of(4, 2 if server.scheme == "s3" else 1, "j.1.0.2.0")  # after the old one's claim, or not
    assert (code, out) == (1, "")
    assert err == (f"python -m dispatch_fence publish: epoch 3 is lower than epoch 4 ({new}) in {root}: "
                   "a superseded execution's save, refused; nothing published\n")
    tree = stores.tree(server, root)
    assert sorted(tree) == ["LATEST"] + sorted(f"{new}/{k}" for k in files_of(new_src))
    assert uploads(server, root) == []


def test_a_part_that_cannot_go_up_aborts_its_upload(s3: objectstores.Server, tmp_path: pathlib.Path) -> None:
    root = s3.root()

    def part_two(method: str, target: str) -> bool:
        return method == "PUT" and "big.bin?partNumber=2&" in target

    with proxy.Proxy(upstream(s3), drop=part_two, drops=aws.ATTEMPTS) as p:
        code, out, err = publish(through(s3, p), staging(tmp_path, "a"), root, 5, "j.1.0.1.0")
        assert len(p.dropped) == aws.ATTEMPTS
    name = checkpoint.name_of(5, 1, "j.1.0.1.0")
    assert (code, out) == (2, "")
    assert re.fullmatch(rf"python -m dispatch_fence publish: {re.escape(root)}: create {name}/big.bin: S3Error: "
                        r"no response RemoteDisconnected: .* \(after 3 retries\)\n", err), err
    assert f"{name}/big.bin" not in stores.tree(s3, root)
    assert uploads(s3, root) == []


def _nth(pattern: str, n: int = 1) -> Callable[[str, str], bool]:
    """The Nth request that matches PATTERN ("METHOD TARGET")."""
    seen = [0]

    def match(method: str, target: str) -> bool:
        if re.search(pattern, f"{method} {target}"):
            seen[0] += 1
            return seen[0] == n
        return False
    return match


# What is lost: the response of the claim (the smallest file), of another file, of the probe's first
# object, of the completion of a multipart upload, of a resumable upload's last chunk. On GCS an
# object's name is not in the URL of a one-request upload: the creates go in order (the probe's two,
# the claim, then the other small file beside the resumable one).
CREATE_GCS = r"^POST .*uploadType=multipart&ifGenerationMatch=0"
LOST: dict[str, dict[str, Callable[[], Callable[[str, str], bool]]]] = {
    "s3": {"the claim": lambda: _nth(r"^PUT .*/ckpt-[^/]*/model\.bin$"),
           "a file": lambda: _nth(r"^PUT .*/ckpt-[^/]*/shards/0\.bin$"),
           "the probe's object": lambda: _nth(r"^PUT .*/\.fence-probe-"),
           "a completion": lambda: _nth(r"^POST .*/big\.bin\?uploadId=")},
    "gs": {"the claim": lambda: _nth(CREATE_GCS, 3),
           "a file": lambda: _nth(CREATE_GCS, 4),
           "the probe's object": lambda: _nth(CREATE_GCS, 1),
           "a resumable upload's last chunk": lambda: _nth(r"^PUT .*upload_id=", 3)},
}


@pytest.mark.parametrize(("scheme", "lost"), [(scheme, lost) for scheme in LOST for lost in LOST[scheme]],
                         ids=[f"{scheme}: {lost}" for scheme in LOST for lost in LOST[scheme]])
def test_a_lost_response_and_a_retry_publish(request: pytest.FixtureRequest, tmp_path: pathlib.Path, scheme: str,
                                             lost: str) -> None:
    server: objectstores.Server = request.getfixturevalue("s3" if scheme == "s3" else "gcs")
    root = server.root()
    src = staging(tmp_path, "a")
    with proxy.Proxy(upstream(server), drop=LOST[server.scheme][lost]()) as p:
        code, out, err = publish(through(server, p), src, root, 5, "j.1.0.1.0")
        assert len(p.dropped) == 1, p.requests
    name = checkpoint.name_of(5, 1, "j.1.0.1.0")
    assert (code, out, err) == (0, f"{root}/{name}\n", "")
    assert published(server, root, name) == files_of(src)
    assert stores.latest(server, root).name == name
    assert uploads(server, root) == []


def test_a_retried_create_that_finds_anothers_object_is_not_taken_for_its_own(s3: objectstores.Server,
                                                                              tmp_path: pathlib.Path) -> None:
    root = s3.root()
    taken = f"{checkpoint.name_of(5, 1, 'j.1.0.1.0')}/model.bin"
    store = stores.open_store(s3, root)
    claim = _nth(r"^PUT .*/ckpt-[^/]*/model\.bin$")

    def another_writer_first(method: str, target: str) -> bool:
        # Before the claim reaches the server, another saver's object is there: the claim and its
        # retry are both refused, and the retry must not take the object for its own.
        if claim(method, target):
            store.create(taken, b"another saver's model")
            return True
        return False

    src = staging(tmp_path, "a")
    with proxy.Proxy(upstream(s3), drop=another_writer_first) as p:
        code, out, err = publish(through(s3, p), src, root, 5, "j.1.0.1.0")
        assert len(p.dropped) == 1
    name = checkpoint.name_of(5, 2, "j.1.0.1.0")  # the next serial
    assert (code, out, err) == (0, f"{root}/{name}\n", "")
    assert published(s3, root, name) == files_of(src)
    assert store.read(taken) == b"another saver's model"
    # What went up alongside the lost claim never appeared under the other saver's name: aborted.
    first = checkpoint.name_of(5, 1, "j.1.0.1.0")
    assert [k for k in stores.tree(s3, root) if k.startswith(first + "/")] == [taken]
    assert uploads(s3, root) == []


@pytest.mark.parametrize(("root", "env", "line"), [
    ("s3://ckpt/x", {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": "k",
                     "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1"},
     r"s3://ckpt/x: create \.fence-probe-\S+: GenericError: Generic S3 error: Error performing PUT "
     r"http://127\.0\.0\.1:9/ckpt/x/\.fence-probe-\S+ in \S+, after 10 retries, .*"),
    ("s3://ckpt/x", {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"},
     r"s3://ckpt/x: configure ckpt: S3Error: no response BadEndpoint: the endpoint http://127\.0\.0\.1:9 is "
     r"http:// and AWS_ALLOW_HTTP is not true"),
    ("gs://ckpt/x", {}, r"gs://ckpt/x: configure ckpt: DefaultCredentialsError: Your default credentials were not found\..*"),
    ("s3://ckpt/x", {"DISPATCH_CHECKPOINT_PART_SIZE": "5000000"},
     r"DISPATCH_CHECKPOINT_PART_SIZE = 5000000 is outside 5242880 \.\.= 5368709120"),
    ("gs://ckpt/x", {"DISPATCH_CHECKPOINT_STREAMS": "08"}, r"DISPATCH_CHECKPOINT_STREAMS = '08' is not a canonical decimal"),
], ids=["s3 down", "s3 http without AWS_ALLOW_HTTP", "gcs without credentials", "a part too small",
        "streams not canonical"])
def test_every_store_error_is_one_line(tmp_path: pathlib.Path, root: str, env: dict[str, str], line: str) -> None:
    code, out, err = publish({**objectstores.NO_METADATA, **env}, kit.staging(tmp_path, "a"), root, 5, "j.1.0.1.0")
    assert (code, out) == (2, "")
    assert re.fullmatch(rf"python -m dispatch_fence publish: {line}\n", err), err
