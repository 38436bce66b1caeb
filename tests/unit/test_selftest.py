"""``cotrain --self-test`` from a source install: the same checks the packaged app runs."""

from __future__ import annotations

import os
import subprocess

from app.selftest import CHECKS as APP_CHECKS
from engine.paths import engine_command
from engine.selftest import CHECKS, ChildCheck


def test_the_self_test_runs_every_check_and_passes(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path), "QT_QPA_PLATFORM": "offscreen"}
    env.pop("COTRAIN_CORPUS_BYTES", None)  # the self-test picks its own small corpus
    done = subprocess.run([*engine_command(), "--self-test"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith(("ok", "FAIL"))]
    assert [line.split()[0] for line in lines] == ["ok"] * len(CHECKS + APP_CHECKS)
    assert [line[6:16].strip() for line in lines] == [name for name, _ in CHECKS + APP_CHECKS]
    assert done.stdout.splitlines()[-1].startswith("all checks passed in ")


def _raises() -> str:
    raise RuntimeError("libtorch_cpu.so: cannot open shared object file")


def _dies() -> str:
    os._exit(3)


def test_a_check_in_the_child_process_reports_its_failure_or_its_death():
    failed = ChildCheck(_raises).outcome(timeout=60)
    assert not failed.ok and failed.detail == "RuntimeError: libtorch_cpu.so: cannot open shared object file"
    assert "Traceback" in failed.trace
    died = ChildCheck(_dies).outcome(timeout=60)
    assert not died.ok and died.detail == "the check's process died (exit status 3)"
