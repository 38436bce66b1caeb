"""The backbone's store: one database, and a repository per domain over it. Each
repository is a small interface of its own (accounts, rounds, credit, curve, checkpoints,
peers, leases, project models), so another database can stand behind them one at a time (SQLite or PostgreSQL,
engine/backbone/store/database.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.backbone.store.account_records import AccountRecords
from engine.backbone.store.checkpoint_records import CheckpointRecords
from engine.backbone.store.credit_records import CreditRecords
from engine.backbone.store.curve_records import CurveRecords
from engine.backbone.store.database import Runner
from engine.backbone.store.lease_records import LeaseRecords
from engine.backbone.store.opening import open_database
from engine.backbone.store.peer_records import PeerRecords
from engine.backbone.store.project_models import ProjectModelRecords
from engine.backbone.store.round_records import RoundRecords


class Store:
    def __init__(self, where: Path | str) -> None:
        """``where``: an SQLite file, or a PostgreSQL server's postgresql:// URL."""
        self.database = open_database(where)
        self.accounts = AccountRecords(self.database)
        self.rounds = RoundRecords(self.database)
        self.credit = CreditRecords(self.database)
        self.curve = CurveRecords(self.database)
        self.checkpoints = CheckpointRecords(self.database)
        self.peers = PeerRecords(self.database)
        self.leases = LeaseRecords(self.database)
        self.models = ProjectModelRecords(self.database)

    @contextmanager
    def fenced(self, project: str, holder: str | None) -> Iterator[Runner]:
        """A transaction that writes only while ``holder`` holds ``project``'s lease
        (LeaseLost if not; None: one process, no leases)."""
        with self.database.transaction() as db:
            if holder is not None:
                self.leases.check(db, project, holder)
            yield db

    @property
    def migrated_hashes(self) -> bool:
        """Stored checkpoints' hashes are to be computed anew (written before schema 2)."""
        return self.database.migrated_hashes

    def close(self) -> None:
        self.database.close()
