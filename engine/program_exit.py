"""Leaving the ``cotrain`` program once its work is done.

A peer imports torch, transformers and aiortc; at exit, CPython's interpreter teardown
walks their millions of objects in one last garbage collection, seconds of CPU (4-5 s
measured for a peer of the tiny project on 2 cores) after the peer has already left its
collaboration and closed its files. The operating system frees that memory at once.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from typing import NoReturn


def leave(code: int) -> NoReturn:
    """Run the atexit handlers (logging's flush, finalizers), flush stdio, and exit."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()  # (a closed pipe, or no console at all in a windowed bundle)
    os._exit(code)
