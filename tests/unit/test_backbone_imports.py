"""The backbone starts without loading what only peers or its first round need."""

import subprocess
import sys


def test_importing_the_backbone_loads_neither_scipy_nor_torch():
    probe = "import sys, engine.backbone.server; print(*[m for m in ('scipy', 'torch') if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          check=True)
    assert done.stdout.split() == [], done.stdout
