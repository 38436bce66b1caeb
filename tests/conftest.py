import asyncio
import os
import time

import pytest

# Peers read a corpus at start-up; a small one keeps tests fast. Set before engine imports.
os.environ.setdefault("COTRAIN_CORPUS_BYTES", str(2 * 1024 * 1024))
# LAN discovery (the app's Projects page) browses loopback only: tests never send mDNS on the
# machine's real network. Tests inside network namespaces widen it again.
os.environ.setdefault("COTRAIN_LAN_INTERFACES", "127.0.0.1")


async def until(condition, timeout: float, what: str = "condition") -> None:
    """Wait for ``condition()`` to hold, failing the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


# A run's closing report (the figures tests measured, the time of each test directory), and
# the stacks of every process a test started when it runs out of time.
pytest_plugins = ["tests.run_report", "tests.hang_stacks"]


@pytest.fixture
def report_figure(request):
    """Figures a test measured (sizes, start-up times), printed at the end of the run so that
    the CI log shows them; `-q` hides what passing tests print."""
    from tests.run_report import FIGURE

    return lambda text: request.node.user_properties.append((FIGURE, text))


@pytest.fixture(autouse=True)
def _loopback_only():
    """aioice never offers 127.0.0.1 by itself; tests keep every connection on loopback."""
    from engine.transport.backends import restrict_host_addresses

    restrict_host_addresses(["127.0.0.1"])
    yield
    restrict_host_addresses(None)


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL server for the session (tests/postgres.py)."""
    from tests.postgres import PostgresMissing, postgres_server

    try:
        with postgres_server() as server:
            yield server
    except PostgresMissing as missing:  # skipped, with the reason -- except in CI, which installs it
        if os.environ.get("CI"):
            pytest.fail(str(missing))
        pytest.skip(str(missing))


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request, tmp_path):
    """Where a backbone's store lives, on each engine in turn: an SQLite file's path, or a
    fresh database on the session's PostgreSQL server."""
    if request.param == "sqlite":
        return tmp_path / "backbone.sqlite3"
    return request.getfixturevalue("postgres").new_database()
