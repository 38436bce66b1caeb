"""Which backbone process runs each project's tracker: a lease, a row with an expiry on the
database's clock, taken by one process and renewed by it while it lives. Another takes it
only once it has expired, so a project has one tracker at a time; its holder also leaves
the project's live figures here (``status``) for the other processes to show."""

from __future__ import annotations

from dataclasses import dataclass

from engine.backbone.store.database import Repository, Runner


class LeaseLost(Exception):
    """Another process holds the project now: what its old holder would write is refused."""


@dataclass(frozen=True)
class Lease:
    holder: str
    url: str  # where the other processes reach the holder
    status: str  # the project's live figures as the holder last wrote them (JSON)


class LeaseRecords(Repository):
    def take(self, project: str, holder: str, url: str, seconds: float, status: str = "") -> bool:
        """Take ``project``'s lease for ``seconds``, or renew ours; False if another
        process holds it and it has not expired."""
        now = self.dialect.now
        cursor = self.db.execute(
            f"INSERT INTO leases (project, holder, url, expires, status) VALUES (?, ?, ?, {now} + ?, ?) "
            "ON CONFLICT (project) DO UPDATE SET holder=excluded.holder, url=excluded.url, "
            "expires=excluded.expires, status=excluded.status "
            f"WHERE leases.holder = excluded.holder OR leases.expires < {now}",
            (project, holder, url, seconds, status))
        return cursor.rowcount == 1

    def holder(self, project: str) -> Lease | None:
        """Who holds ``project`` now (None: nobody, or a lease that expired)."""
        row = self.db.execute(
            f"SELECT holder, url, status FROM leases WHERE project=? AND expires >= {self.dialect.now}",
            (project,)).fetchone()
        return Lease(*row) if row else None

    def check(self, db: Runner, project: str, holder: str) -> None:
        """In transaction ``db``: LeaseLost unless ``holder`` holds ``project`` now. The
        lease's row stays locked to the end of it: a takeover waits for our write, or we
        see the takeover."""
        row = db.execute(f"SELECT 1 FROM leases WHERE project=? AND holder=? AND expires >= "
                         f"{self.dialect.now}{self.dialect.locking}", (project, holder)).fetchone()
        if row is None:
            raise LeaseLost(f"this process's lease on {project} ran out, and another may hold it: "
                            "its tracker writes nothing more")

    def release(self, project: str, holder: str) -> None:
        """Give ``project`` up at once (a process shutting down cleanly)."""
        self.db.execute("DELETE FROM leases WHERE project=? AND holder=?", (project, holder))
