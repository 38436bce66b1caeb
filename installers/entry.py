"""The frozen app's entry point: the same ``cotrain`` command, in one executable.

The app starts its worker and a local backbone by running this executable again with a
subcommand, so ``freeze_support`` must come first (multiprocessing children on Windows
and macOS re-enter here too). Before it, the stand-in for PyAV, which the bundle leaves out:
a child may import aiortc.
"""

import multiprocessing

from engine.transport.without_media import install_if_missing

if __name__ == "__main__":
    install_if_missing()
    multiprocessing.freeze_support()
    from engine.cli import run

    run()
