"""A backbone server installs without torch, Qt or WebRTC: ``pip install -e '.[backbone]'`` in a
fresh venv, then ``cotrain backbone`` starts, lets a peer join and serves the leaderboard.

Slow (a venv and a pip install from the package index, ~30 s); it needs the index, which CI
reaches. Set COTRAIN_TEST_OFFLINE=1 to skip it on a machine without.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import venv
from pathlib import Path

import pytest

from engine.wire import WIRE_VERSION

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def backbone_venv(tmp_path_factory) -> Path:
    if os.environ.get("COTRAIN_TEST_OFFLINE"):
        pytest.skip("needs the package index (COTRAIN_TEST_OFFLINE is set)")
    where = tmp_path_factory.mktemp("backbone-venv")
    venv.create(where, with_pip=True)
    done = subprocess.run([str(where / "bin" / "pip"), "install", "-q", "-e", f"{ROOT}[backbone]"],
                          capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return where


def test_the_backbone_extra_leaves_out_torch_qt_and_webrtc(backbone_venv):
    python = str(backbone_venv / "bin" / "python")
    for heavy in ("torch", "PySide6", "aiortc", "webrtc"):
        done = subprocess.run([python, "-c", f"import {heavy}"], capture_output=True, text=True, timeout=60)
        assert done.returncode != 0 and "No module named" in done.stderr, (heavy, done.stderr[-500:])
    # What it does need: the round scheduler's LP solver.
    done = subprocess.run([python, "-c", "from scipy.optimize import linprog"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_cotrain_backbone_runs_from_the_backbone_extra_alone(backbone_venv, tmp_path):
    backbone = subprocess.Popen([str(backbone_venv / "bin" / "cotrain"), "backbone", "--port", "0",
                                 "--data-dir", str(tmp_path / "data")],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert backbone.stdout is not None
        line = backbone.stdout.readline()  # empty if it died: then stderr says why
        assert line.startswith("backbone listening on http://"), line or backbone.communicate()[1][-3000:]
        url = line.split()[-1]
        join = urllib.request.Request(f"{url}/api/projects/demo-lm/peers", method="POST",
                                      data=json.dumps({"name": "probe", "wire": WIRE_VERSION}).encode(),
                                      headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(join, timeout=30) as resp:
            joined = json.load(resp)
            assert resp.status == 201 and joined["project"]["id"] == "demo-lm" and joined["peer_id"]
        with urllib.request.urlopen(f"{url}/api/projects/demo-lm/leaderboard", timeout=30) as resp:
            board = json.load(resp)
            assert resp.status == 200 and board["project"] == "demo-lm" and board["entries"] == []
    finally:
        backbone.terminate()
        backbone.wait(30)
    assert backbone.returncode in (0, -15, 130)


def test_the_backbone_and_its_wire_import_alone_in_this_venv_too():
    """The same boundary, checked where every extra is installed: nothing the backbone
    imports drags torch, Qt or aiortc in (numpy and scipy it needs: the LP of round shares)."""
    code = ("import sys, engine.backbone.server, engine.backbone.routes; "
            "print(sorted(m for m in ('torch', 'PySide6', 'aiortc', 'engine.peer', 'app') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
