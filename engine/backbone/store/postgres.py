"""The backbone's durable state on a PostgreSQL server, which several backbone processes
can share: the same schema and repositories as SQLite's file, through a small pool of
connections (psycopg 3) that reconnects when the server restarts.

Each statement outside a transaction commits on its own (autocommit), as on SQLite;
transactions run on one connection, all or nothing. Creating the schema takes an advisory
lock, so processes starting together do not race each other's CREATE TABLE.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from engine.backbone.store.database import Conflict, Params, Unavailable
from engine.backbone.store.schema import POSTGRES, SCHEMA_VERSION

log = logging.getLogger(__name__)
CONNECT_TIMEOUT = 15.0  # seconds to reach the server when the backbone starts
POOL_SIZE = 4  # connections per process: its event loop runs one statement at a time
SCHEMA_LOCK = 0x636F7472  # the advisory lock taken while creating or checking the schema


@dataclass
class FetchedRows:
    """A statement's rows, read before its connection went back to the pool."""

    rows: list[Any] = field(default_factory=list)
    rowcount: int = -1

    def fetchone(self) -> Any:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[Any]:
        return self.rows


@functools.lru_cache(maxsize=512)
def _postgres_sql(sql: str) -> str:
    """The repositories' `?` parameters as psycopg's `%s`."""
    return sql.replace("%", "%%").replace("?", "%s")


def where_is(url: str) -> str:
    """The server and database a URL names, without its password (for messages and logs)."""
    try:
        info = conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise ValueError(f"not a PostgreSQL URL ({exc})") from None
    host, port = info.get("host", "localhost"), info.get("port", 5432)
    return f"{info.get('user', '')}@{host}:{port}/{info.get('dbname', '')}"


class _Connection:
    """Statements on one connection (a transaction's)."""

    def __init__(self, connection: psycopg.Connection) -> None:
        self.connection = connection

    def execute(self, sql: str, params: Params = ()) -> FetchedRows:
        try:
            cursor = self.connection.execute(_postgres_sql(sql), params)
        except psycopg.IntegrityError as exc:
            raise Conflict(str(exc)) from exc
        return FetchedRows(cursor.fetchall() if cursor.description else [], cursor.rowcount)

    def executemany(self, sql: str, params: Sequence[Params]) -> None:
        with self.connection.cursor() as cursor:
            cursor.executemany(_postgres_sql(sql), params)


class PostgresDatabase:
    dialect = POSTGRES
    migrated_hashes = False  # PostgreSQL stores began after schema 2

    def __init__(self, url: str) -> None:
        self.where = where_is(url)
        try:  # once alone, for the server's own words on what is wrong (the pool retries quietly)
            psycopg.connect(url, connect_timeout=int(CONNECT_TIMEOUT)).close()
        except psycopg.OperationalError as exc:
            reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            raise OSError(f"cannot use the database {self.where}: {reason}") from None
        self.pool = ConnectionPool(url, min_size=1, max_size=POOL_SIZE, kwargs={"autocommit": True},
                                   name="cotrain-backbone", open=True)
        try:
            self.pool.wait(timeout=CONNECT_TIMEOUT)
        except PoolTimeout:
            self.pool.close()
            raise OSError(f"cannot reach the database {self.where} within {CONNECT_TIMEOUT:.0f} s") from None
        try:
            self._create_schema()
        except psycopg.Error as exc:
            self.pool.close()
            raise RuntimeError(f"cannot set up the database {self.where}: {exc}") from None
        except BaseException:
            self.pool.close()
            raise

    def _create_schema(self) -> None:
        with self.transaction() as db:
            db.execute("SELECT pg_advisory_xact_lock(?)", (SCHEMA_LOCK,))
            db.connection.execute(self.dialect.schema)
            row = db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            version = int(row[0]) if row else SCHEMA_VERSION
            if version > SCHEMA_VERSION:
                raise RuntimeError(f"the database {self.where} was written by a newer Cotrain "
                                   f"(schema {version})")
            for target in range(version + 1, SCHEMA_VERSION + 1):
                log.info("%s: migrating to schema %d", self.where, target)
                db.connection.execute(self.dialect.migrations[target])
            db.execute("INSERT INTO meta VALUES ('schema', ?) ON CONFLICT (key) DO UPDATE "
                       "SET value = excluded.value", (str(SCHEMA_VERSION),))

    def execute(self, sql: str, params: Params = ()) -> FetchedRows:
        with self._answering(), self.pool.connection() as connection:
            return _Connection(connection).execute(sql, params)

    def executemany(self, sql: str, params: Sequence[Params]) -> None:
        with self._answering(), self.pool.connection() as connection:
            _Connection(connection).executemany(sql, params)

    @contextmanager
    def transaction(self) -> Iterator[_Connection]:
        with self._answering(), self.pool.connection() as connection, connection.transaction():
            yield _Connection(connection)

    @contextmanager
    def _answering(self) -> Iterator[None]:
        """A server gone or a pool exhausted (PoolTimeout is one) as Unavailable."""
        try:
            yield
        except psycopg.OperationalError as exc:
            raise Unavailable(f"the database {self.where} did not answer: {exc}") from exc

    def close(self) -> None:
        self.pool.close()
