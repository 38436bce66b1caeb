"""Start-up: how long `import engine.backbone.server` takes in a fresh process (the median of
7), and which heavy libraries it loads. The backbone restarts with its host; scipy's LP
solver loads when the first round is planned, torch never.

    python -m tests.bench.imports [--quick]
"""

from __future__ import annotations

import statistics
import subprocess
import sys

HEAVY = ("scipy", "torch", "numpy", "transformers", "PySide6", "aiortc")
PROBE = f"""
import sys, time
began = time.perf_counter()
import engine.backbone.server
took = time.perf_counter() - began
print(took, *[m for m in {HEAVY!r} if m in sys.modules])
"""


def fresh_import() -> tuple[float, list[str]]:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    took, *loaded = done.stdout.split()
    return float(took), loaded


def main(quick: bool = False) -> None:
    runs = [fresh_import() for _ in range(3 if quick else 7)]
    seconds = [took for took, _ in runs]
    print("\n== Start-up: import engine.backbone.server, fresh processes")
    print(f"median {statistics.median(seconds):.3f} s (target < 0.5 s); runs: "
          + ", ".join(f"{s:.3f}" for s in seconds))
    print(f"heavy libraries loaded: {', '.join(runs[0][1]) or 'none'}")


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
