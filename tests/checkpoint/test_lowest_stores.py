"""The object stores' clients at the lowest versions the `s3` and `gcs` extras allow (obstore 0.7.0,
google-cloud-storage 3.0.0: the lowest venv of devcluster/build-torch-venv.sh), through the fence,
on the local S3 server and the GCS emulator: two publishes (the claim, each file's create-only
upload, LATEST by compare-and-set), a superseded execution's save refused, retention, a ranged
read and a download. The suites of the stores themselves run at the pinned versions in the
project's venv; the DCP suite's lowest tests run a load's ranged reads and an async save on S3 too.
"""

from __future__ import annotations

import subprocess

import pytest

from devcluster import objectstores
from dispatch_fence import checkpoint
from tests.checkpoint import kit

SCRIPT = r"""
import os, sys, tempfile
import google.cloud.storage, obstore
from dispatch_fence import model, objectstore
root = sys.argv[1]
print("clients", obstore.__version__, google.cloud.storage.__version__)
def staging(token, size):
    d = tempfile.mkdtemp()
    open(os.path.join(d, "model.bin"), "wb").write(token.encode() * size)
    open(os.path.join(d, model.MARKER), "w").close()
    return d
a = objectstore.publish(staging("a", 10), root, epoch=5, attempt="j.1", keep=2)
b = objectstore.publish(staging("b", 3_000_000), root, epoch=6, attempt="j.2", keep=2)
c = objectstore.publish(staging("c", 10), root, epoch=6, attempt="j.2", keep=2)
try:
    objectstore.publish(staging("x", 10), root, epoch=5, attempt="j.1", keep=2)
except model.StaleEpoch as exc:
    print("refused:", exc)
print("kept", *[found.name for found in objectstore.checkpoints(root)])
print("latest", objectstore.latest(root).name)
print("range", objectstore.read_file(b, "model.bin", (1, 4)).decode())
into = tempfile.mkdtemp()
objectstore.download(c, into)
print("download", open(os.path.join(into, "model.bin")).read())
"""


@pytest.mark.parametrize("kind", ["s3", "gcs"])
def test_at_the_lowest_clients_the_extras_allow_a_root_publishes_refuses_prunes_and_reads(
        torch_lowest_python: str, kind: str, request: pytest.FixtureRequest) -> None:
    server: objectstores.Server = request.getfixturevalue(kind)
    root = server.root()
    env = {**objectstores.clean_env(), **server.env, "PYTHONPATH": str(kit.REPO / "fence")}
    out = subprocess.run([torch_lowest_python, "-c", SCRIPT, root], env=env, capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    names = [checkpoint.name_of(6, s, "j.2") for s in (2, 3)]
    assert out.stdout.splitlines() == [
        "clients 0.7.0 3.0.0",
        (f"refused: epoch 5 is lower than epoch 6 ({names[1]}) in {root}: a superseded execution's save, "
         "refused; nothing published"),
        f"kept {names[0]} {names[1]}",
        f"latest {names[1]}",
        "range bbbb",
        "download cccccccccc",
    ], out.stderr[-3000:]
