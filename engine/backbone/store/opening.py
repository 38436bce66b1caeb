"""Which database a backbone opens: a path is an SQLite file (the embedded default), a
``postgresql://`` URL a PostgreSQL server that several backbone processes can share."""

from __future__ import annotations

from pathlib import Path

from engine.backbone.store.database import Database
from engine.backbone.store.sqlite import SqliteDatabase


def is_database_url(where: str) -> bool:
    return where.startswith(("postgresql://", "postgres://"))


def open_database(where: Path | str) -> Database:
    """The database at ``where``, created or migrated to this schema."""
    if isinstance(where, str) and is_database_url(where):
        try:
            from engine.backbone.store.postgres import PostgresDatabase  # only its users need psycopg
        except ImportError as exc:  # the desktop app's bundle leaves it out
            needs = f"a backbone on PostgreSQL needs {exc.name}: pip install 'cotrain[backbone]'"
            raise RuntimeError(needs) from None
        return PostgresDatabase(where)
    return SqliteDatabase(Path(where))
