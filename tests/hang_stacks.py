"""When a test runs out of time, the stacks of the processes it started (peers, backbones,
the app) are printed with its failure: pytest-timeout prints only the test process's own.

A timer per test fires just before pytest-timeout's and asks py-spy for each child's stacks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator

import psutil
import pytest

# The stacks are taken this long before the timeout fails the test (py-spy needs a second
# or two per process).
LEAD_SECONDS, LEAD_SHARE = 30.0, 0.25
DUMP_SECONDS = 20


def timeout_of(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is not None and (marker.args or "timeout" in marker.kwargs):
        return float(marker.args[0] if marker.args else marker.kwargs["timeout"])
    option = item.config.getoption("timeout", None)
    return float(option if option is not None else item.config.getini("timeout") or 0)


def dump_children() -> None:
    """Write each descendant process's Python stacks to our stderr, which pytest shows with
    the failure."""
    spy = shutil.which("py-spy", path=os.path.dirname(sys.executable)) or shutil.which("py-spy")
    children = psutil.Process().children(recursive=True)
    lines = [f"\n=== stacks of the {len(children)} processes this test started, before its timeout ===\n"]
    for child in children:
        try:
            command = " ".join(child.cmdline())[:200]
        except psutil.Error:
            continue
        lines.append(f"--- pid {child.pid}: {command}\n")
        if spy is None:
            lines.append("(py-spy is not installed: no stacks)\n")
            continue
        try:
            done = subprocess.run([spy, "dump", "--pid", str(child.pid)], capture_output=True, text=True,
                                  timeout=DUMP_SECONDS)
            lines.append(done.stdout or done.stderr)
        except subprocess.TimeoutExpired:
            lines.append("(py-spy took too long)\n")
    os.write(2, "".join(lines).encode(errors="replace"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    seconds = timeout_of(item)
    lead = min(LEAD_SECONDS, seconds * LEAD_SHARE)
    timer = threading.Timer(seconds - lead, dump_children) if seconds > 0 else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
