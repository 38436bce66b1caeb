"""Run by tests/unit/test_launcher.py as ``python -m``: says what process it finds itself in."""

import json
import os
import sys
import threading

import engine  # noqa: F401 - as every module the tests launch, through which its floor holds

if __name__ == "__main__":
    print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "probe": os.environ.get("PROBE"),
                      "hub_offline": os.environ.get("HF_HUB_OFFLINE"), "stdin": sys.stdin.read(),
                      "threads": threading.active_count()}),
          flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    if sys.argv[1] == "wait":
        threading.Event().wait()
    sys.exit(int(sys.argv[1]))
