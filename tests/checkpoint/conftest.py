"""Fixtures of the checkpoint tests: the object-store servers (devcluster/objectstores.py), and
for the DCP and Lightning suites the torch virtualenv and a root on each store."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from devcluster import objectstores, torch_venv


@pytest.fixture(scope="session", params=sorted(objectstores.SERVERS))
def server(request: pytest.FixtureRequest) -> Iterator[objectstores.Server]:
    """An S3 server with conditional writes, then a GCS emulator with generation preconditions."""
    s = objectstores.SERVERS[request.param]()
    try:
        yield s.start()
    finally:
        s.close()


@pytest.fixture(params=sorted(objectstores.SERVERS))
def server_without_conditional_writes(request: pytest.FixtureRequest) -> Iterator[objectstores.Server]:
    """The same kind of server at a release that ignores the preconditions (a real one, not a mock)."""
    s = objectstores.SERVERS[request.param](objectstores.WITHOUT_CONDITIONAL_WRITES[request.param])
    try:
        yield s.start()
    finally:
        s.close()


# The torch virtualenv and the stores the DCP and Lightning suites run on.
@pytest.fixture(scope="module")
def torch_python() -> str:
    """The python of the cached torch virtualenv (devcluster/build-torch-venv.sh builds it once)."""
    return str(torch_venv.python())


@pytest.fixture(scope="module")
def torch_lowest_python() -> str:
    """The same at the lowest versions the fence's extras allow (build-torch-venv.sh lowest)."""
    return str(torch_venv.python("lowest"))


@pytest.fixture(scope="module")
def s3() -> Iterator[objectstores.Server]:
    server = objectstores.S3Server()
    try:
        yield server.start()
    finally:
        server.close()


@pytest.fixture(scope="module")
def gcs() -> Iterator[objectstores.Server]:
    server = objectstores.GCSServer()
    try:
        yield server.start()
    finally:
        server.close()


@pytest.fixture(params=["posix", "s3", "gcs"])
def where(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> tuple[str, objectstores.Server | None]:
    """(root, its server: None for a POSIX root)."""
    if request.param == "posix":
        return str(tmp_path / "root"), None
    server = request.getfixturevalue(request.param)
    return server.root(), server


@pytest.fixture(scope="module", autouse=True)
def _stores_of_this_module_only() -> Iterator[None]:
    """The fence keeps one store per root and process, configured when first opened; a module's
    servers are its own, so a root another module opened (the docs' examples share one) must not
    reach the earlier module's stopped server."""
    from dispatch_fence import objectstore

    yield
    for store in objectstore._stores.values():
        store.close()  # its part threads
    objectstore._stores.clear()
    objectstore._probed.clear()
