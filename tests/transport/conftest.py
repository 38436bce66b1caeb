"""Link tests run on each WebRTC stack this machine has (engine/transport/backends/)."""

import pytest

from engine.transport import backends
from engine.wire.types import Transport


@pytest.fixture(params=[Transport.NATIVE, Transport.AIORTC], ids=lambda t: t.value)
def stack(request, monkeypatch) -> Transport:
    """Every link of the test runs on this stack (the native one skipped where it cannot run)."""
    if request.param is Transport.NATIVE and backends.native_problem():
        pytest.skip(f"native stack unavailable here: {backends.native_problem()}")
    monkeypatch.setenv(backends.ENV, request.param.value)
    return request.param


@pytest.fixture
def aiortc_only(monkeypatch) -> None:
    """For what only aiortc has: aioice's sockets and consent checks, which Cotrain patches."""
    monkeypatch.setenv(backends.ENV, Transport.AIORTC.value)
