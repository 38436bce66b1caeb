"""What a run prints at its end beyond pass and fail: the figures tests measured, and the wall
time of each test directory, so the change that costs minutes is seen at once.

Both travel in test reports, so they reach the printing process when xdist runs the tests in
workers: figures as the test's user properties, times as each report's start and stop.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

FIGURE = "figure"
TIMES_FILE = "COTRAIN_TEST_TIMES"  # where .ci/run wants the directories' times, as JSON


@dataclass
class DirectoryTime:
    start: float = float("inf")
    stop: float = 0.0
    busy: float = 0.0  # the sum of its tests' durations: more than wall where workers overlap
    tests: set[str] = field(default_factory=set)

    def add(self, report: pytest.TestReport) -> None:
        self.start = min(self.start, report.start)
        self.stop = max(self.stop, report.stop)
        self.busy += report.duration
        self.tests.add(report.nodeid)


class RunReport:
    def __init__(self) -> None:
        self.figures: list[str] = []
        self.directories: dict[str, DirectoryTime] = {}

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.directories.setdefault(directory_of(report.nodeid), DirectoryTime()).add(report)
        if report.when == "teardown":  # by then the test has added all it measured
            name = report.nodeid.rsplit("::", 1)[-1]
            self.figures += [f"{name}: {text}" for key, text in report.user_properties if key == FIGURE]

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.figures:
            terminalreporter.section("figures measured by the tests")
            for line in self.figures:
                terminalreporter.write_line(line)
        if not self.directories:
            return
        terminalreporter.section("wall time per test directory")
        rows = sorted(self.directories.items(), key=lambda item: -(item[1].stop - item[1].start))
        for name, spent in rows:
            terminalreporter.write_line(
                f"{name:<12} {(spent.stop - spent.start) / 60:6.1f} min wall  {spent.busy / 60:6.1f} min "
                f"in its tests  ({len(spent.tests)} tests)")
        path = os.environ.get(TIMES_FILE)
        if path:  # the test command runs pytest more than once: each run adds its directories
            times = json.loads(Path(path).read_text()) if os.path.exists(path) else {}
            times.update({name: {"wall": spent.stop - spent.start, "busy": spent.busy,
                                 "tests": len(spent.tests)} for name, spent in rows})
            Path(path).write_text(json.dumps(times))


def directory_of(nodeid: str) -> str:
    parts = nodeid.split("::", 1)[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0]


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # xdist's workers report to the controller, which prints
        config.pluginmanager.register(RunReport(), "cotrain-run-report")
