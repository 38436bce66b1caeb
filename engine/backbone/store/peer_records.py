"""The peers a project has seen, and their sessions: a user's online time is the union of
their peers' sessions (two peers for an hour are one hour online)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine.backbone.store.database import Repository
from engine.wire.types import PeerRole

NEVER_CONNECTED_KEPT = 3600.0  # a peer that joined and never opened its socket, forgotten after
LEFT_KEPT = 86400.0  # a peer gone this long is forgotten (it joins anew); its credit stays


@dataclass(frozen=True)
class KnownPeer:
    name: str
    token_sha256: str
    user_id: int | None
    role: PeerRole
    joined_at: float


class PeerRecords(Repository):
    def add(self, peer_id: str, project: str, name: str, token_sha256: str,
                 user_id: int | None, role: PeerRole = PeerRole.TRAINER) -> None:
        self.db.execute(
            "INSERT INTO peers (peer_id, project, name, token_sha256, user_id, joined_at, role) "
            "VALUES (?,?,?,?,?,?,?)", (peer_id, project, name, token_sha256, user_id, time.time(), str(role)),
        )

    def known(self, peer_id: str, project: str) -> KnownPeer | None:
        """A peer of ``project``, as it joined (its role stays with it across reconnects)."""
        row = self.db.execute(
            "SELECT name, token_sha256, user_id, role, joined_at FROM peers WHERE peer_id=? AND project=?",
            (peer_id, project),
        ).fetchone()
        return KnownPeer(row[0], row[1], row[2], PeerRole(row[3]), row[4]) if row else None

    def connected(self, peer_id: str, at: float | None = None) -> None:
        now = at if at is not None else time.time()
        self.db.execute("UPDATE peers SET connected_at=?, last_seen=?, left_at=NULL WHERE peer_id=?",
                        (now, now, peer_id))

    def seen(self, peer_ids: list[str]) -> None:
        # One transaction, not one commit per peer: 1000 peers took 37 ms of the event loop.
        now = time.time()
        with self._transaction() as db:
            db.executemany("UPDATE peers SET last_seen=? WHERE peer_id=?", [(now, p) for p in peer_ids])

    def left(self, peer_id: str, at: float | None = None) -> None:
        """Close the peer's session; its user's online time grows by the part of it that no
        other closed session of theirs covers (two peers for an hour are one hour online)."""
        with self._transaction() as db:
            row = db.execute(
                "SELECT project, user_id, connected_at FROM peers WHERE peer_id=? "
                "AND connected_at IS NOT NULL AND left_at IS NULL", (peer_id,),
            ).fetchone()
            if row is not None:
                project, user_id, started = row
                ended = max(at if at is not None else time.time(), started)
                db.execute("UPDATE peers SET left_at=?, last_seen=? WHERE peer_id=?", (ended, ended, peer_id))
                if user_id is not None:
                    others = db.execute(
                        "SELECT started, ended FROM sessions WHERE project=? AND user_id=? "
                        "AND ended > ? AND started < ?", (project, user_id, started, ended),
                    ).fetchall()
                    db.execute("INSERT INTO sessions VALUES (?,?,?,?,?)",
                               (project, user_id, peer_id, started, ended))
                    latest = self.dialect.greatest("user_totals.last_seen", "excluded.last_seen")
                    db.execute(
                        "INSERT INTO user_totals (project, user_id, online_seconds, last_seen) "
                        "VALUES (?,?,?,?) ON CONFLICT(project, user_id) DO UPDATE SET "
                        "online_seconds = user_totals.online_seconds + excluded.online_seconds, "
                        f"last_seen = {latest}",
                        (project, user_id, ended - started - _covered(started, ended, others), ended),
                    )

    def prune(self, now: float | None = None) -> int:
        """Forget peers that joined and never connected, or left long ago: join is cheap, and
        a row kept for ever for each would fill the disk. Their credit (contributions, with
        their users), online time (sessions) and totals do not depend on these rows."""
        now = now if now is not None else time.time()
        cursor = self.db.execute(
            "DELETE FROM peers WHERE (connected_at IS NULL AND joined_at < ?) OR left_at < ?",
            (now - NEVER_CONNECTED_KEPT, now - LEFT_KEPT))
        return cursor.rowcount

    def close_stale_sessions(self) -> None:
        """After a crash: sessions that never ended count until their peer was last seen."""
        rows = self.db.execute(
            "SELECT peer_id, last_seen FROM peers WHERE connected_at IS NOT NULL AND left_at IS NULL"
        ).fetchall()
        for peer_id, last_seen in rows:
            self.left(peer_id, at=last_seen)


def _covered(start: float, end: float, intervals: list[tuple[float, float]]) -> float:
    """How much of [start, end] the union of ``intervals`` covers."""
    covered, reach = 0.0, start
    for lo, hi in sorted(intervals):
        lo, hi = max(lo, reach), min(hi, end)
        if hi > lo:
            covered += hi - lo
            reach = hi
    return covered
