"""`cotrain` leaves without the interpreter's teardown (seconds of garbage collection after
torch and aiortc): what a user or the app reads from it must still all arrive."""

import subprocess
import sys

PROGRAM = """
import atexit, logging, sys
from engine.program_exit import leave
logging.basicConfig(filename=sys.argv[1], level=logging.INFO)
atexit.register(lambda: sys.stderr.write("handler ran"))
logging.getLogger("peer").info("left the collaboration")
sys.stdout.write("last line, not yet flushed")
leave(3)
"""


def test_leaving_keeps_the_exit_code_the_output_the_log_and_the_atexit_handlers(tmp_path):
    log = tmp_path / "peer.log"
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(log)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 3
    assert done.stdout == "last line, not yet flushed"
    assert done.stderr == "handler ran"
    assert "left the collaboration" in log.read_text()
