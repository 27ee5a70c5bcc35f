"""Engine creation, schema set-up and readiness for the read model (SQLite or PostgreSQL)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DatabaseError
from sqlmodel import SQLModel, create_engine

from readmodel import models  # noqa: F401  (registers the tables on SQLModel.metadata)


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
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(connection: Any, _record: Any) -> None:
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    return engine


def create_schema(engine: Engine) -> None:
    """Create missing tables; safe to run twice, and from two processes starting together."""
    try:
        SQLModel.metadata.create_all(engine)
    except DatabaseError:
        # Another process created the same table between our check and our CREATE: retry once,
        # now that it exists the check skips it.
        SQLModel.metadata.create_all(engine)


def ping(engine: Engine) -> None:
    """Raise if the database does not answer."""
    with engine.connect() as connection:
        connection.execute(text("SELECT 1"))
