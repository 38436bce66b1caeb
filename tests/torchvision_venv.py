"""A Python that has torchvision, for the tests of ``torchvision:`` models.

torchvision is built against one torch release, and PyPI's builds load only beside PyPI's
(CUDA) torch: not beside the CPU wheel of torch 2.13 this project's venv pins ("operator
torchvision::nms does not exist"). The tests of torchvision's models therefore run in a venv
of their own, beside the project's, with the newest pair these machines' pip allows: made
on first use (about 6 GB from PyPI, a minute or two on a fast link) and kept in
``.venv-torchvision``, remade when what it installs changes. ``.ci/run`` starts making it
(``python3 tests/torchvision_venv.py``) while the tests before it run: its test then waits
for that, not for its own download. Cotrain itself is not installed there (an install
builds in this tree, beside the project venv's own build): its tests run from this tree,
which ``env()`` puts on their path. Everything but that torch pair comes at the versions of
``installers/requirements.lock``, as in the project's venv.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # (the README's Python 3.10)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-torchvision"
RELEASES = ["torch==2.14.1", "torchvision==0.29.1"]  # a pair built for each other
LOCK = ROOT / "installers" / "requirements.lock"
# What the lock holds for its own torch (2.13.0's CUDA libraries): the pair above brings its own.
NOT_FROM_THE_LOCK = re.compile(r"(torch|torchvision|triton|nvidia-[\w.-]+)==")


def peer_requirements() -> list[str]:
    """What ``cotrain[peer]`` installs, as pyproject.toml says (its extras unfolded)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements, extras, seen = list(project["dependencies"]), ["peer"], set()
    while extras:
        extra = extras.pop()
        seen.add(extra)
        for requirement in project["optional-dependencies"][extra]:
            if requirement.startswith(f"{project['name']}["):
                extras += [e for e in requirement.split("[")[1].rstrip("]").split(",") if e not in seen]
            else:
                requirements.append(requirement)
    return requirements


def constraints() -> str:
    """The lock, without what the torch pair decides for itself (pip constraints, no markers lost)."""
    return "".join(line + "\n" for line in LOCK.read_text().splitlines() if not NOT_FROM_THE_LOCK.match(line))


def env() -> dict[str, str]:
    """The environment to run this tree's tests (and the peers they start) in that venv; its
    run's test times are the enclosing test's, not a directory's of their own in the file
    where .ci/run keeps the directories' times."""
    kept = {k: v for k, v in os.environ.items() if k != "COTRAIN_TEST_TIMES"}
    return {**kept, "PYTHONPATH": str(ROOT)}


# The peer's own dependencies and what the tests that run there import.
PACKAGES = [*RELEASES, "pytest>=8", "pytest-asyncio>=0.23", "pytest-timeout>=2.2", "scikit-learn>=1.3",
            *peer_requirements()]
READY = "import torchvision.models, engine.tasks.images, pytest_asyncio, pytest_timeout, sklearn"
INSTALL_SECONDS = 1200  # making the venv, all steps together


def torchvision_python() -> Path:
    """That venv's python, made on first use; skips the test, saying why, where it cannot be
    installed (no package registry, or one too slow)."""
    import pytest

    python, problem = made()
    if problem is not None:
        pytest.skip(problem)
    return python


def made() -> tuple[Path, str | None]:
    """The venv's python, and why it could not be made (None once it loads torchvision)."""
    python = VENV / "bin" / "python"
    with open(ROOT / ".venv-torchvision.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (two processes never build it at once)
        if _ready(python):
            return python, None
        deadline = time.monotonic() + INSTALL_SECONDS
        pinned = ROOT / ".venv-torchvision.constraints"
        pinned.write_text(constraints())
        steps = [[sys.executable, "-m", "venv", "--clear", str(VENV)],
                 [str(python), "-m", "pip", "install", "-q", "--no-cache-dir", "--disable-pip-version-check",
                  "-c", str(pinned), *PACKAGES]]
        for step in steps:
            try:
                done = subprocess.run(step, capture_output=True, text=True,
                                      timeout=max(deadline - time.monotonic(), 1.0))
            except subprocess.TimeoutExpired:
                return python, f"installing {' and '.join(RELEASES)} took over {INSTALL_SECONDS} s"
            if done.returncode:
                last = (done.stderr.strip().splitlines() or ["(pip said nothing)"])[-1]
                return python, f"could not install {' and '.join(RELEASES)} for torchvision's models: {last}"
        assert _ready(python, after_install=True), f"{VENV} was installed but torchvision does not load in it"
        return python, None


def _ready(python: Path, after_install: bool = False) -> bool:
    """Whether the venv loads what the tests need and was made for the packages asked now."""
    marker = VENV / "cotrain-installed"
    wanted = hashlib.sha256("\n".join(PACKAGES).encode() + (ROOT / "pyproject.toml").read_bytes()
                            + constraints().encode()).hexdigest()
    if not after_install and (not marker.exists() or marker.read_text() != wanted):
        return False
    loads = python.exists() and subprocess.run([str(python), "-c", READY], capture_output=True,
                                               env=env()).returncode == 0
    if loads and after_install:
        marker.write_text(wanted)
    return loads


if __name__ == "__main__":
    made_python, problem = made()
    print(problem or f"torchvision loads in {made_python}")
