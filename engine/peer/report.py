"""Turns a peer's events into terminal output: a status line, and JSON lines with ``--json``."""

from __future__ import annotations

import json
import sys

from engine.console import StatusLine, bar, megabytes
from engine.peer.events import (
    Aggregated,
    ComputingOn,
    Connection,
    EpochCompleted,
    Governed,
    Joined,
    PeerEvent,
    RoundFailed,
    StatusChanged,
    Stopped,
    Synced,
    SyncProgress,
)


class ConsoleReporter:
    def __init__(self, json_lines: bool = False) -> None:
        self.json_lines = json_lines
        self.line = StatusLine()
        self._sync_shown = -1

    def __call__(self, event: PeerEvent) -> None:
        if isinstance(event, Joined):
            who = f" for {event.username}" if event.username else " anonymously"
            self.line.say(f"joined '{event.project.title}' as peer {event.peer_id}{who}")
        elif isinstance(event, Connection):
            self.line.say(event.message)
        elif isinstance(event, ComputingOn):
            self.line.say(f"computing on {event.description}")
        elif isinstance(event, Governed):
            self.line.say(event.reason if event.running else f"paused: {event.reason}")
        elif isinstance(event, SyncProgress):
            if event.total:
                pct = int(100 * event.received / event.total)
                if pct // 10 != self._sync_shown or self.line.tty:
                    self._sync_shown = pct // 10
                    self.line.update(f"downloading state from {event.source} {bar(pct / 100)} "
                                     f"{pct}% of {megabytes(event.total)}")
            else:
                self.line.update(f"asking {event.source} for the current state")
        elif isinstance(event, Synced):
            self._sync_shown = -1
            self.line.say(f"in sync at epoch {event.epoch} (state from {event.source}, "
                          f"state {event.state_sha256[:12]})")
        elif isinstance(event, EpochCompleted):
            r = event.step
            loss = f"{r.loss:.4f}" if r.loss is not None else "n/a"
            self.line.say(f"epoch {r.epoch}: loss {loss}, {r.samples} samples from {r.peers} peers "
                          f"(mine {event.my_samples}), averaged in {r.round_seconds:.1f}s")
            if self.json_lines:
                print(json.dumps({"epoch": r.epoch, "round_id": r.round_id, "loss": r.loss,
                                  "samples": r.samples, "peers": r.peers, "state_sha256": r.state_sha256,
                                  "round_seconds": round(r.round_seconds, 3),
                                  "averaging_seconds": round(event.averaging_seconds, 3),
                                  "averaging_began": round(event.averaging_began, 3),
                                  "took_seconds": round(event.took_seconds, 4),
                                  "first_byte_seconds": None if event.first_byte_seconds is None
                                  else round(event.first_byte_seconds, 4),
                                  "my_samples": event.my_samples,
                                  "paths": {p: str(v) if v else None for p, v in event.paths.items()}}),
                      flush=True)
        elif isinstance(event, Aggregated):
            self.line.say(f"round {event.round_id} (epoch {event.epoch}): aggregated "
                          f"{megabytes(event.bytes_in)} from {event.senders} peers in {event.seconds:.1f}s")
            if self.json_lines:
                print(json.dumps({"aggregated": event.bytes_in, "round_id": event.round_id,
                                  "epoch": event.epoch, "senders": event.senders, "parts": event.parts,
                                  "seconds": round(event.seconds, 3)}), flush=True)
        elif isinstance(event, RoundFailed):
            self.line.say(f"round for epoch {event.epoch} failed: {event.reason}")
        elif isinstance(event, StatusChanged):
            s = event.status
            eta = f", next step in ~{s.eta_seconds:.0f}s" if s.eta_seconds is not None else ""
            sent, received = megabytes(event.traffic.bytes_sent), megabytes(event.traffic.bytes_received)
            self.line.update(f"epoch {s.epoch} {bar(s.samples / max(s.target, 1))} "
                             f"{s.samples}/{s.target} samples, {s.peers} peers, "
                             f"{s.samples_per_second:.1f} samples/s{eta}; sent {sent}, received {received}")
        elif isinstance(event, Stopped):
            self.line.say(f"stopped: {event.reason}")
        sys.stderr.flush()
