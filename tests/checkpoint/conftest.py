"""Fixtures of the checkpoint tests: the object-store servers (devcluster/objectstores.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devcluster import objectstores


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
