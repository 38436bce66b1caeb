"""The frozen app's entry point: the same ``cotrain`` command, in one executable.

The app starts its worker and a local backbone by running this executable again with a
subcommand, so ``freeze_support`` must come first (multiprocessing children on Windows
and macOS re-enter here too).
"""

import multiprocessing
import sys

if __name__ == "__main__":
    multiprocessing.freeze_support()
    from engine.cli import main

    sys.exit(main())
