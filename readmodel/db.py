"""Engine creation, schema set-up and readiness for the read model (SQLite or PostgreSQL)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.schema import CreateIndex, CreateTable
from sqlmodel import SQLModel, create_engine

from readmodel import models  # noqa: F401  (registers the tables on SQLModel.metadata)

# Any constant will do: it names the lock every process takes while it creates the schema.
_SCHEMA_LOCK_KEY = 0x6F7574626F78  # "outbox"
_WAL_SWITCH_TIMEOUT_S = 30.0


def normalise_url(database_url: str) -> str:
    """`postgresql://` and `postgres://` URLs use psycopg 3, the driver this project installs."""
    for prefix in ("postgres://", "postgresql://"):
        if database_url.startswith(prefix):
            return "postgresql+psycopg://" + database_url[len(prefix) :]
    return database_url


def make_engine(database_url: str) -> Engine:
    """An engine for `database_url`; SQLite gets WAL and a busy timeout so readers never block."""
    url = make_url(normalise_url(database_url))
    if url.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)
    if url.database and url.database != ":memory:":
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    # The API and the worker use the engine from threads (asyncio.to_thread).
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(connection: sqlite3.Connection, _record: Any) -> None:
        cursor = connection.cursor()
        try:
            cursor.execute("PRAGMA busy_timeout=30000")
            _enable_wal(cursor)
            cursor.execute("PRAGMA synchronous=NORMAL")
        finally:
            cursor.close()

    return engine


def _enable_wal(cursor: sqlite3.Cursor) -> None:
    # WAL is a property of the file, so only the first connection to a new file switches it. The
    # switch fails at once with SQLITE_BUSY while another connection holds the file (no busy
    # timeout), so processes opening a new file together retry until one of them has switched it.
    deadline = time.monotonic() + _WAL_SWITCH_TIMEOUT_S
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as err:
            if err.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def create_schema(engine: Engine) -> None:
    """Create missing tables and indexes; safe to run twice, and from two processes at once."""
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # CREATE ... IF NOT EXISTS still races on PostgreSQL (both pass the check, one fails
            # on the catalog's unique index), so processes take turns; the lock ends with the
            # transaction.
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEMA_LOCK_KEY}
            )
        _create_missing(connection)


def _create_missing(connection: Connection) -> None:
    # IF NOT EXISTS makes the check and the creation one statement, which SQLite runs under its
    # write lock: a second process starting together finds the table instead of failing.
    for table in SQLModel.metadata.sorted_tables:
        connection.execute(CreateTable(table, if_not_exists=True))
        for index in sorted(table.indexes, key=lambda index: str(index.name)):
            connection.execute(CreateIndex(index, if_not_exists=True))


def ping(engine: Engine) -> None:
    """Raise if the database does not answer."""
    with engine.connect() as connection:
        connection.execute(text("SELECT 1"))
