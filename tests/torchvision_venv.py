"""A Python that has torchvision, for the tests of ``torchvision:`` models.

torchvision is built against one torch release, and PyPI's builds load only beside PyPI's
(CUDA) torch: not beside the CPU wheel of torch 2.13 this project's venv pins ("operator
torchvision::nms does not exist"). The tests of torchvision's models therefore run in a venv
of their own, beside the project's, with the newest pair these machines' pip allows --
created once (about 6 GB and a minute from PyPI) and kept in ``.venv-torchvision``.
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-torchvision"
RELEASES = ("torch==2.14.1", "torchvision==0.29.1")  # a pair built for each other
READY = "import torchvision.models, engine.tasks.images, pytest_asyncio, sklearn"
INSTALL_SECONDS = 1200


def torchvision_python() -> Path:
    """That venv's python, created on first use; skips the test, saying why, where it
    cannot be installed (no package registry)."""
    python = VENV / "bin" / "python"
    with open(ROOT / ".venv-torchvision.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (two test processes never build it at once)
        if _ready(python):
            return python
        steps = [[sys.executable, "-m", "venv", "--clear", str(VENV)],
                 [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *RELEASES,
                  "-e", f"{ROOT}[test]"]]
        for step in steps:
            try:
                done = subprocess.run(step, capture_output=True, text=True, timeout=INSTALL_SECONDS)
            except subprocess.TimeoutExpired:
                pytest.skip(f"installing {' and '.join(RELEASES)} took over {INSTALL_SECONDS} s")
            if done.returncode:
                pytest.skip(f"could not install {' and '.join(RELEASES)} for torchvision's models: "
                            f"{done.stderr.strip().splitlines()[-1:]}")
        assert _ready(python), f"{VENV} was installed but torchvision does not load in it"
        return python


def _ready(python: Path) -> bool:
    return python.exists() and subprocess.run([str(python), "-c", READY], capture_output=True).returncode == 0
