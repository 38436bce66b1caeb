"""Ask a TURN server for a relay allocation with given credentials; print what it answered.

    python -m tests.nat.turn_allocate HOST PORT USERNAME PASSWORD
prints {"ok": true, "relayed": [host, port]} or {"ok": false, "error": "..."}.
"""

from __future__ import annotations

import asyncio
import json
import sys

from aioice.stun import TransactionFailed, TransactionTimeout
from aioice.turn import create_turn_endpoint


async def allocate(host: str, port: int, username: str, password: str) -> dict:
    try:
        transport, _ = await asyncio.wait_for(
            create_turn_endpoint(asyncio.DatagramProtocol, (host, port), username, password), 20)
    except (TransactionFailed, TransactionTimeout, asyncio.TimeoutError, OSError) as exc:
        return {"ok": False, "error": str(exc) or type(exc).__name__}
    relayed = transport.get_extra_info("sockname")
    transport.close()
    return {"ok": True, "relayed": list(relayed)}


if __name__ == "__main__":
    host, port, username, password = sys.argv[1:5]
    print(json.dumps(asyncio.run(allocate(host, int(port), username, password))), flush=True)
