"""What a tracker decided, carried out: messages sent and broadcast, the record written.

A tracker runs in the one process holding its project's lease. A holder whose event loop
stalled past its lease may still be running it when another process has taken the project
over: the writes that move the collaboration (a step and its epoch, a round opened, the
state) are fenced -- one transaction with a check that the lease is still ours (the lease's
row locked on PostgreSQL, so a takeover waits for it, or it sees the takeover) -- and a
refused one stops the tracker here, having written nothing."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from engine.backbone.store.lease_records import LeaseLost
from engine.backbone.tracker import (
    Broadcast,
    CollaborationState,
    Out,
    RecordCredits,
    RecordHeldOut,
    RecordStep,
    RoundOpened,
    Send,
    WithdrawCredits,
)
from engine.wire.codec import encode_text
from engine.wire.control import Step

if TYPE_CHECKING:
    from engine.backbone.server import Backbone

log = logging.getLogger(__name__)
# One line a step, which `cotrain backbone` shows without -v: an operator's sign of progress.
steps_log = logging.getLogger("engine.backbone.steps")


def execute(backbone: Backbone, project: str, outs: list[Out]) -> None:
    """Send, broadcast, record -- if the tracker still runs here (one stopped when another
    process took its project over records nothing)."""
    if project not in backbone.trackers:
        return
    try:
        for out in outs:
            _carry_out(backbone, project, out)
    except LeaseLost as exc:
        backbone.stop_tracker(project, str(exc))


def _carry_out(backbone: Backbone, project: str, out: Out) -> None:
    store = backbone.store
    if isinstance(out, Send):
        session = backbone.sessions.get(out.to)
        if session is not None:
            session.send(encode_text(out.msg))
    elif isinstance(out, Broadcast):
        text = encode_text(out.msg)
        for session in backbone.sessions.values():
            if session.project == project:
                session.send(text)
    elif isinstance(out, RecordStep):
        with store.fenced(project, _holder(backbone)) as db:
            store.rounds.record_step(project, out.step, db)
        if backbone.curve_events is not None:
            backbone.curve_events.step(project, out.step)
        _log_step(project, out.step)
    elif isinstance(out, RecordHeldOut):
        store.curve.record_heldout(project, out.epoch, out.loss, out.accuracy, out.scores)
        if backbone.curve_events is not None:
            backbone.curve_events.heldout(project, out.epoch, out.loss, out.accuracy)
    elif isinstance(out, RecordCredits):  # (a round's credit is written once: a replay adds nothing)
        owners = _owners(backbone, project, out.credits)
        store.credit.record_credits(project, out.round_id, out.credits, owners)
    elif isinstance(out, WithdrawCredits):
        samples = store.credit.withdraw_credits(project, out.peer_id, out.round_ids, out.why)
        log.warning("%s: withdrew the %d samples credited to %s in %d rounds it reduced unchecked "
                    "(their steps stand, computed from its results): %s; %s", project, samples, out.peer_id,
                    len(out.round_ids), _named(out.round_ids), out.why)
    elif isinstance(out, RoundOpened):
        with store.fenced(project, _holder(backbone)) as db:
            store.rounds.round_opened(project, out, db)
    elif isinstance(out, CollaborationState):
        with store.fenced(project, _holder(backbone)) as db:
            store.rounds.set_collaboration(project, out.epoch, out.state_sha256, db)


def _named(round_ids: list[int], most: int = 50) -> str:
    """Rounds by id, for an operator to look up (the first ``most`` of a long run)."""
    shown = ", ".join(str(r) for r in round_ids[:most])
    return f"rounds {shown}" + (f" and {len(round_ids) - most} more" if len(round_ids) > most else "")


def _holder(backbone: Backbone) -> str | None:
    """Our lease's holder name (None: one process, no leases)."""
    return backbone.leases.holder if backbone.leases is not None else None


def _log_step(project: str, step: Step) -> None:
    loss = "none" if step.loss is None else f"{step.loss:.4f}"
    steps_log.info("%s: step %d, %d samples from %d peer%s, loss %s, averaged in %.1f s", project,
                   step.epoch, step.samples, step.peers, "" if step.peers == 1 else "s", loss,
                   step.round_seconds)


def _owners(backbone: Backbone, project: str, peers) -> dict[str, int | None]:
    owners = {}
    for peer_id in peers:
        session = backbone.sessions.get(peer_id)
        if session is not None:
            owners[peer_id] = session.user_id
        else:  # left since the round began; its work still counts
            known = backbone.store.peers.known(peer_id, project)
            owners[peer_id] = known.user_id if known else None
    return owners
