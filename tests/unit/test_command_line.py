"""Mistakes on the command line: each is named with its flag, exits 2, and is answered before
anything heavy loads (before, `cotrain peer` took 5-10 s importing torch to say what was
missing, `--threads 0` answered with a schema path and exit 1, and `--port 99999` was taken
and wrapped to another port)."""

import subprocess
import time

import pytest

from engine.paths import engine_command

HEAVY = {"torch", "numpy", "aiortc", "transformers", "tokenizers", "PySide6", "scipy"}
CASES = [
    (["peer"], "give --backbone URL and --project ID"),
    (["peer", "--backbone", "http://127.0.0.1:1", "--project", "p", "--threads", "0"],
     "argument --threads: must be from 1 to 1024, not 0"),
    (["peer", "--backbone", "http://127.0.0.1:1", "--project", "p", "--cpu-percent", "250"],
     "argument --cpu-percent: must be from 1 to 100"),
    (["peer", "--backbone", "http://127.0.0.1:1", "--project", "p", "--schedule", "someday"],
     "argument --schedule: unknown day 'someday'"),
    (["peer", "--backbone", "ftp://example.org", "--project", "p"], "--backbone: not a backbone address"),
    (["backbone", "--port", "99999"], "argument --port: must be from 0 to 65535, not 99999"),
    (["register", "--backbone", "http://example.org:99999"], "has no valid port"),
    (["register", "--backbone", "http://example.org:8470", "--username", "x"], "--username: a username is"),
    (["demo", "--peers", "zero"], "argument --peers: 'zero' is not a whole number"),
]


@pytest.mark.parametrize("args, says", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_usage_error_names_the_flag_exits_2_and_is_quick(args, says):
    began = time.monotonic()
    done = subprocess.run([*engine_command(), *args], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    took = time.monotonic() - began
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr
    assert took < 3.0, took  # (a loaded machine; the target is below)


def test_a_usage_error_loads_nothing_heavy():
    """What made it slow, by what the interpreter imported rather than a stopwatch (a shared
    machine's clock says more about its other load)."""
    python, *rest = engine_command()
    done = subprocess.run([python, "-X", "importtime", *rest, "peer"], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "give --backbone URL" in done.stderr
    imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert "engine.cli" in imported or "engine.__main__" in imported, sorted(imported)[:20]
    assert not imported & HEAVY, sorted(imported & HEAVY)


def test_the_help_reads_as_plain_text():
    done = subprocess.run([*engine_command(), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "``" not in done.stdout and "desktop app" in done.stdout
