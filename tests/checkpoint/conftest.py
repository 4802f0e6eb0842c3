"""Fixtures of the checkpoint tests: the object-store servers (tests/checkpoint/stores.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.checkpoint import stores


@pytest.fixture(scope="session", params=sorted(stores.SERVERS))
def server(request: pytest.FixtureRequest) -> Iterator[stores.Server]:
    """An S3 server with conditional writes, then a GCS emulator with generation preconditions."""
    s = stores.SERVERS[request.param]()
    try:
        yield s.start()
    finally:
        s.close()


@pytest.fixture(params=sorted(stores.SERVERS))
def server_without_conditional_writes(request: pytest.FixtureRequest) -> Iterator[stores.Server]:
    """The same kind of server at a release that ignores the preconditions (a real one, not a mock)."""
    s = stores.SERVERS[request.param](stores.WITHOUT_CONDITIONAL_WRITES[request.param])
    try:
        yield s.start()
    finally:
        s.close()
