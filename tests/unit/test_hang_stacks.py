"""A test that hangs fails at its timeout with the Python stacks of the processes it started
(tests/hang_stacks.py), not only its own: where a peer or the backbone was stuck is in the log."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HANGING = '''
import subprocess, sys, pytest

CHILD = "import time\\ndef waiting_for_a_round_that_never_comes():\\n    time.sleep(120)\\n" \\
        "waiting_for_a_round_that_never_comes()"

@pytest.mark.timeout(6)
def test_waits_on_a_stuck_child():
    child = subprocess.Popen([sys.executable, "-c", CHILD])
    try:
        child.wait()
    finally:
        child.kill()
'''


@pytest.mark.timeout(90)
def test_a_timed_out_test_shows_the_stacks_of_its_children(tmp_path):
    (tmp_path / "test_hanging.py").write_text(HANGING)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.hang_stacks", "-p",
                           "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path / "test_hanging.py")],
                          capture_output=True, text=True, timeout=80,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "Timeout" in out, out[-3000:]
    assert "stacks of the 1 processes this test started" in out, out[-3000:]
    assert "waiting_for_a_round_that_never_comes" in out, out[-3000:]
