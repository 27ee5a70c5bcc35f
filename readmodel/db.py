"""Engine creation, schema migrations and readiness for the read model (SQLite or PostgreSQL)."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

# Any constant will do: it names the lock every process takes while it migrates the schema.
_SCHEMA_LOCK_KEY = 0x6F7574626F78  # "outbox"
_WAL_SWITCH_TIMEOUT_S = 30.0
# How long a cancelled `in_thread` caller waits for its thread's statement to end.
_CANCELLED_WAIT_S = 5.0

P = ParamSpec("P")
T = TypeVar("T")
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# PostgreSQL's SQLSTATEs for a table and a column the statement names but the schema lacks.
_UNDEFINED_OBJECT_STATES = {"42P01": "table", "42703": "column"}
_POSTGRES_NAMED = re.compile(r'(?:relation|column) "([^"]+)"')
_SQLITE_MISSING = re.compile(r"no such (table|column): (\S+)")
# The revision whose tables `create_schema` made before the read model had migrations.
UNVERSIONED_REVISION = "0001"


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


def create_schema(engine: Engine, migrations: Sequence[Path] = ()) -> None:
    """Migrate the read model to the newest revision; safe to run twice, and from two processes
    at once. A database made before migrations (tables, no `alembic_version`) is upgraded in place.

    `migrations` are the registered aggregate types' own (`AggregateTypes.migrations`): each a
    directory of revisions on a branch of its own, brought to its head with the product's.
    """
    with schema_lock(engine) as connection:
        check_schema_known(connection, migrations)
        if _at_heads(connection, migrations):
            # The common case at every start: loading the revisions once more for an upgrade
            # that does nothing costs a quarter of a second per process start.
            return
        config = alembic_config(connection, migrations)
        if _is_unversioned(connection):
            # Its tables are revision 0001's: record that rather than create them again.
            command.stamp(config, UNVERSIONED_REVISION)
        command.upgrade(config, "heads")


@dataclass(frozen=True)
class _Revisions:
    known: frozenset[str]
    heads: frozenset[str]


@functools.cache
def _revisions(migrations: tuple[Path, ...]) -> _Revisions:
    """Every revision, and the heads, of the product's migrations and `migrations`' branches:
    read from the files once per process (they do not change under a running process; loading
    them took a quarter of a second at each start and each `/readyz`)."""
    script = ScriptDirectory.from_config(_script_config(migrations))
    known = frozenset(revision.revision for revision in script.walk_revisions())
    return _Revisions(known, frozenset(script.get_heads()))


def _at_heads(connection: Connection, migrations: Sequence[Path]) -> bool:
    current = set(MigrationContext.configure(connection).get_current_heads())
    return bool(current) and _revisions(tuple(migrations)).heads <= current


class SchemaNewerThanCode(RuntimeError):
    """The read model was migrated by a newer release than this code: a process of this code
    must not start on it (it would read and write tables it does not know)."""


def check_schema_known(connection: Connection, migrations: Sequence[Path] = ()) -> None:
    """Raise `SchemaNewerThanCode` if the database is at a revision this code's migrations (the
    product's and `migrations`' branches) do not have, naming both revisions and the way back
    (docs/how-to/upgrade.md)."""
    revisions = _revisions(tuple(migrations))
    current = MigrationContext.configure(connection).get_current_heads()
    unknown = sorted(set(current) - revisions.known)
    if not unknown:
        return
    heads = sorted(revisions.heads)
    way_back = " then ".join(f"`alembic downgrade {head}`" for head in heads)
    raise SchemaNewerThanCode(
        f"the read model's schema is at revision {', '.join(unknown)}, which this code does not"
        f" know (its newest: {', '.join(heads)}): a newer release migrated it. Run that release"
        f" again, or first take the schema back with the newer release's own migrations"
        f" ({way_back}, run from its checkout or image; see docs/how-to/upgrade.md, 'Roll back')"
    )


def verify_schema(engine: Engine, migrations: Sequence[Path] = ()) -> None:
    """`check_schema_known` for a process that reads and writes the read model but leaves
    migrating it to others (an activities-only worker)."""
    with engine.connect() as connection:
        check_schema_known(connection, migrations)


def schema_not_at_head(engine: Engine, migrations: Sequence[Path] = ()) -> str | None:
    """Why the read model's schema is not at this code's head revisions, naming both and the way
    there; None when it is. Raises if the database does not answer."""
    with engine.connect() as connection:
        current = set(MigrationContext.configure(connection).get_current_heads())
    heads = set(_revisions(tuple(migrations)).heads)
    if heads <= current:
        return None
    at = ", ".join(sorted(current)) or "none (no `alembic_version` table)"
    return (
        f"the read model's schema is at revision {at}, not at this code's head"
        f" {', '.join(sorted(heads))}: run `alembic upgrade heads` with this release's"
        " DATABASE_URL (docs/how-to/upgrade.md)"
    )


def missing_schema_object(err: DBAPIError) -> str | None:
    """The table or column a statement failed on because the schema lacks it (`table
    "outbox_items"`), the sign of a schema behind the code; None for any other database error."""
    state = getattr(err.orig, "sqlstate", None)
    if state in _UNDEFINED_OBJECT_STATES:
        named = _POSTGRES_NAMED.search(str(err.orig))
        return f'{_UNDEFINED_OBJECT_STATES[state]} "{named.group(1) if named else "?"}"'
    missing = _SQLITE_MISSING.search(str(err.orig))
    if isinstance(err.orig, sqlite3.OperationalError) and missing:
        return f'{missing.group(1)} "{missing.group(2)}"'
    return None


def alembic_config(connection: Connection, migrations: Sequence[Path] = ()) -> Config:
    """Alembic's configuration for migrating the read model over `connection` (no alembic.ini),
    with the branches of `migrations` beside the product's revisions."""
    config = _script_config(migrations)
    # env.py migrates on this connection, inside the caller's transaction.
    config.attributes["connection"] = connection
    return config


def _script_config(migrations: Sequence[Path]) -> Config:
    """Where the revisions are: the product's, and the branches of `migrations` beside them."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if migrations:
        locations = [MIGRATIONS_DIR / "versions", *migrations]
        config.set_main_option("path_separator", "os")
        # ConfigParser reads "%" as interpolation: a path holding one must say "%%".
        joined = os.pathsep.join(str(location) for location in locations)
        config.set_main_option("version_locations", joined.replace("%", "%%"))
    return config


@contextmanager
def schema_lock(engine: Engine) -> Iterator[Connection]:
    """A connection whose transaction holds the read model's schema lock; commits on success."""
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # Released when the transaction ends; PostgreSQL's DDL commits with it, all or nothing.
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEMA_LOCK_KEY}
            )
        elif connection.dialect.name == "sqlite":
            # pysqlite opens no transaction before DDL, so without this each statement commits on
            # its own; IMMEDIATE takes the write lock now, and a second process waits (busy
            # timeout) until the first has committed, then finds the schema up to date.
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        yield connection


# unnest scans the array in its order: the locks are taken sorted.
_ADVISORY_LOCKS = text(
    "SELECT count(pg_advisory_xact_lock(k)) FROM unnest(CAST(:keys AS bigint[])) AS k"
)


def lock_scopes(connection: Connection, scopes: Iterable[str]) -> None:
    """Hold each of `scopes` (any strings; named by their table, e.g. `attempts/<item id>`) for
    the rest of the transaction: advisory locks on PostgreSQL, taken in one statement and in
    one order (the scopes sorted, as the permits ledger always took them, so processes of the
    release before wait in the same order), so no two transactions wait on each other in a
    cycle. SQLite has one writer at a time, so there the transaction takes the write lock now
    (`BEGIN IMMEDIATE`) unless a write already holds it: pysqlite opens a transaction only at
    the first write, and a caller that read first (the attempt log reads an item's last
    number) went on from what it read while other writers committed. Attempts were lost so: a
    writer that waited for the lock wrote numbers the others had already pruned."""
    if connection.dialect.name == "sqlite":
        if not connection.connection.dbapi_connection.in_transaction:  # type: ignore[union-attr]
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        return
    if connection.dialect.name != "postgresql":
        return
    keys = list(
        dict.fromkeys(
            int.from_bytes(hashlib.sha256(scope.encode()).digest()[:8], "big", signed=True)
            for scope in sorted(scopes)
        )
    )
    if keys:
        connection.execute(_ADVISORY_LOCKS, {"keys": keys})


def _is_unversioned(connection: Connection) -> bool:
    tables = set(inspect(connection).get_table_names())
    return "outbox_items" in tables and "alembic_version" not in tables


async def in_thread(func: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`asyncio.to_thread` for reads that hold a pooled connection, in loops that are cancelled
    when their process stops (the live tailer, the metrics' readers): a cancelled caller waits for
    the thread (up to `_CANCELLED_WAIT_S`) before the cancellation goes on. The engine is disposed
    right after; a connection still checked out by a running thread then went back to the
    disposed pool and was never closed (psycopg warned of it when it was collected, in whatever
    test ran then)."""
    future = asyncio.ensure_future(asyncio.to_thread(func, *args, **kwargs))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        # Its outcome is nobody's now: retrieved, so an error is not reported as unhandled.
        future.add_done_callback(lambda done: done.cancelled() or done.exception())
        await asyncio.wait({future}, timeout=_CANCELLED_WAIT_S)
        raise


def ping(engine: Engine) -> None:
    """Raise if the database does not answer."""
    with engine.connect() as connection:
        connection.execute(text("SELECT 1"))
