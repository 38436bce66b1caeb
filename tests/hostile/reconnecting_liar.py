"""A wrong reducer (tests/hostile/wrong_reducer.py) that reconnects its control socket a few
seconds after each lie, hoping to come back as a newcomer: before punishment belonged to
the identity, a reconnect gave it a fresh member state -- an hour of exclusion and its
strikes, gone. Started like ``cotrain peer``; it logs "reconnecting after round N"."""

import asyncio
import logging

from engine import cli
from engine.averaging import tensor_parts
from engine.peer.client import ControlClient
from tests.hostile import wrong_reducer

log = logging.getLogger("reconnecting_liar")
AFTER = 4.0  # seconds after a lie
honest_connect = ControlClient.connect
lying_combine = wrong_reducer.wrong_combine
clients: list[tuple[ControlClient, asyncio.AbstractEventLoop]] = []
closing: set[asyncio.Future] = set()


async def remembered_connect(self: ControlClient) -> None:
    await honest_connect(self)
    if not any(client is self for client, _ in clients):
        clients.append((self, asyncio.get_running_loop()))


def reconnect(round_id: int) -> None:
    for client, _ in clients:
        if client._ws is not None and not client._ws.closed:
            log.warning("reconnecting after round %d", round_id)
            task = asyncio.ensure_future(client._ws.close())
            closing.add(task)
            task.add_done_callback(closing.discard)


def combine_then_reconnect(self, contributions):
    result = lying_combine(self, contributions)
    if wrong_reducer.cued:
        for _, loop in clients:
            loop.call_soon_threadsafe(loop.call_later, AFTER, reconnect, self.plan.round_id)
    return result


if __name__ == "__main__":
    wrong_reducer.install()
    tensor_parts.TensorPartReducer.combine = combine_then_reconnect
    ControlClient.connect = remembered_connect  # type: ignore[method-assign]
    cli.run()
