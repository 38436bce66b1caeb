"""Run every benchmark in turn, each in a fresh process (so one's memory and threads never
colour another's figures); each prints its own table."""

import subprocess
import sys

MODULES = ("imports", "wire", "compute", "aggregation", "load_balancing", "verification", "allreduce",
           "round_start", "backbone_load", "grouped_schedule", "governor", "nat", "shaped_links",
           "local_mode", "collaboration", "gui")

if __name__ == "__main__":
    flags = [a for a in sys.argv[1:] if a == "--quick"]
    failed = [m for m in MODULES
              if subprocess.run([sys.executable, "-m", f"tests.bench.{m}", *flags]).returncode != 0]
    if failed:
        print(f"benchmarks that failed: {', '.join(failed)}", file=sys.stderr)
    sys.exit(1 if failed else 0)
