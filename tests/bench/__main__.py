"""Run every benchmark in turn; each prints its own table."""

import sys

from tests.bench import allreduce, backbone_load, compute, governor, gui, nat

if __name__ == "__main__":
    quick = "--quick" in sys.argv
    compute.main(quick=quick)
    allreduce.main(quick=quick)
    backbone_load.main(quick=quick)
    governor.main(quick=quick)
    nat.main(quick=quick)
    gui.main(quick=quick)
