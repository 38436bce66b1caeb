"""Running a CLI command on a pseudo-terminal, typing answers at its prompts."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time


def run_in_terminal(argv: list[str], answers: dict[str, str], env: dict,
                    timeout: float = 120) -> tuple[int, str]:
    """Run ``argv`` with a pty as stdin/stdout/stderr; when the output ends with a key of
    ``answers`` (a prompt), type its value. Returns (exit status, everything shown)."""
    master, slave = pty.openpty()
    process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                               start_new_session=True, close_fds=True)
    os.close(slave)
    shown, pending = b"", dict(answers)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                shown += chunk
                for prompt in list(pending):
                    if shown.rstrip().endswith(prompt.encode().rstrip()):
                        os.write(master, (pending.pop(prompt) + "\n").encode())
            elif process.poll() is not None:
                break
        else:
            process.kill()
            raise AssertionError(f"{argv} did not finish in {timeout}s: {shown.decode(errors='replace')}")
    finally:
        os.close(master)
    return process.wait(timeout=10), shown.decode(errors="replace")
