"""What every repository (engine/backbone/store/) works through: a database that runs the
repositories' SQL (one text for SQLite and PostgreSQL, `?` for parameters; the few
fragments that differ are its ``dialect``'s), and transactions on it (the engines:
store/sqlite.py, store/postgres.py; which one, store/opening.py)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from engine.backbone.store.schema import Dialect

Params = Sequence[Any]


class Conflict(Exception):
    """A row the statement would add is there already (a unique key)."""


class Unavailable(Exception):
    """The database did not answer (down, cut off, out of connections): worth trying again
    later, never a crash."""


class Rows(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Runner(Protocol):
    """Runs statements: the database itself, or one transaction on it."""

    def execute(self, sql: str, params: Params = ()) -> Rows: ...

    def executemany(self, sql: str, params: Sequence[Params]) -> None: ...


class Database(Runner, Protocol):
    dialect: Dialect
    migrated_hashes: bool  # stored checkpoints' hashes are to be computed anew (schema < 2)

    def transaction(self) -> Any:
        """A context manager giving a Runner: all of it or none of it."""

    def close(self) -> None: ...


class Repository:
    """What every repository shares: the database, and transactions on it."""

    def __init__(self, database: Database) -> None:
        self.db = database
        self.dialect = database.dialect

    @contextmanager
    def _transaction(self) -> Iterator[Runner]:
        with self.db.transaction() as runner:
            yield runner
