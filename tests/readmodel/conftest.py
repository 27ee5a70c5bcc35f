"""The read model runs on SQLite and on PostgreSQL: every test here runs on both.

PostgreSQL is expected at `READMODEL_POSTGRES_URL` (trust auth); when it is unreachable its tests
fail, unless `READMODEL_SKIP_POSTGRES=1` says this machine has none.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Engine, make_url, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import QueuePool

from readmodel.db import create_schema, make_engine
from tests.conftest import migrated_sqlite_file

POSTGRES_URL = os.environ.get(
    "READMODEL_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


class EngineFactory:
    """Makes an engine onto the test's own database of a name (a file, or a schema); every call
    makes a new engine, as another process would."""

    def __init__(self, connect: Callable[[str], Engine]) -> None:
        self._connect = connect

    def __call__(self, name: str) -> Engine:
        """An engine onto that database, without creating any table."""
        return self._connect(name)

    def migrated(self, name: str, migrations: Sequence[Path] = ()) -> Engine:
        """An engine onto that database, migrated to head (`create_schema`)."""
        engine = self._connect(name)
        create_schema(engine, migrations)
        return engine


class SqliteEngineFactory(EngineFactory):
    """SQLite files; a migrated one is a copy of a file this process migrated once."""

    def __init__(self, connect: Callable[[str], Engine], folder: Path, templates: Path) -> None:
        super().__init__(connect)
        self._folder = folder
        self._templates = templates

    def migrated(self, name: str, migrations: Sequence[Path] = ()) -> Engine:
        migrated_sqlite_file(self._folder / f"{name}.db", self._templates, migrations)
        return self._connect(name)


@contextmanager
def _sqlite(tmp_path: Path, templates: Path) -> Iterator[EngineFactory]:
    engines: list[Engine] = []
    folder = tmp_path / "readmodel"

    def connect(name: str) -> Engine:
        engines.append(make_engine(f"sqlite:///{folder / name}.db"))
        return engines[-1]

    yield SqliteEngineFactory(connect, folder, templates)
    for engine in engines:
        engine.dispose()


class PostgresEngineFactory(EngineFactory):
    """Schemas; a migrated one is made by the DDL of a schema this process migrated once."""

    def __init__(
        self, connect: Callable[[str], Engine], admin: Engine, schema_of: Callable[[str], str]
    ) -> None:
        super().__init__(connect)
        self._admin = admin
        self._schema_of = schema_of

    def migrated(self, name: str, migrations: Sequence[Path] = ()) -> Engine:
        script = _migrated_schema_script(self._admin, tuple(migrations))
        if script is None:  # no pg_dump on this machine: alembic each time
            return super().migrated(name, migrations)
        engine = self._connect(name)
        with self._admin.begin() as connection:
            # Many statements in one call: psycopg sends a script without parameters as one.
            connection.exec_driver_sql(script.replace(_TEMPLATE, self._schema_of(name)))
        return engine


# Stands for the schema's name in a dumped script.
_TEMPLATE = "schema_template_0f3a"
# The DDL (and the alembic_version rows) of a migrated schema, per set of extra migrations.
_MIGRATED_SCRIPTS: dict[tuple[Path, ...], str | None] = {}


def _migrated_schema_script(admin: Engine, migrations: tuple[Path, ...]) -> str | None:
    """The SQL that makes a schema as `create_schema` leaves it: `pg_dump --schema-only` of one
    this process migrated (once per set of migrations), with its `alembic_version` rows: one round
    trip, where alembic runs every revision for each test's schema
    (docs/decisions/parallel-tests.md). `create_schema` itself
    is tested on fresh schemas by `test_migrations.py` and `test_store.py`."""
    if migrations in _MIGRATED_SCRIPTS:
        return _MIGRATED_SCRIPTS[migrations]
    pg_dump = shutil.which("pg_dump")
    script = None
    if pg_dump is not None:
        template = f"{_TEMPLATE}_{uuid.uuid4().hex[:8]}"
        with admin.begin() as connection:
            connection.execute(text(f'CREATE SCHEMA "{template}"'))
        try:
            migrated = make_engine(f"{POSTGRES_URL}?options=-csearch_path%3D{template}")
            create_schema(migrated, migrations)
            with migrated.connect() as connection:
                versions = connection.execute(text("SELECT version_num FROM alembic_version"))
                rows = [row[0] for row in versions]
            migrated.dispose()
            url = make_url(POSTGRES_URL)
            dumped = subprocess.run(
                [
                    pg_dump,
                    f"--host={url.host}",
                    f"--port={url.port or 5432}",
                    f"--username={url.username}",
                    f"--dbname={url.database}",
                    f"--schema={template}",
                    "--schema-only",
                    "--no-owner",
                    "--no-privileges",
                ],
                capture_output=True,
                text=True,
            )
        finally:
            with admin.begin() as connection:
                connection.execute(text(f'DROP SCHEMA "{template}" CASCADE'))
        if dumped.returncode != 0:  # e.g. a pg_dump older than the server: alembic each time
            logging.getLogger(__name__).warning("pg_dump failed: %s", dumped.stderr)
            _MIGRATED_SCRIPTS[migrations] = None
            return None
        # The dump's session settings (an empty search_path among them), its psql commands
        # (`\restrict`) and its CREATE SCHEMA stay out: the schema exists, and every name in the
        # dump is qualified.
        statements = "\n".join(
            line
            for line in dumped.stdout.splitlines()
            if not line.startswith(("SET ", "SELECT pg_catalog.set_config", "CREATE SCHEMA", "\\"))
        )
        inserts = "".join(
            f"INSERT INTO {template}.alembic_version (version_num) VALUES ('{row}');\n"
            for row in rows
        )
        script = (statements + "\n" + inserts).replace(template, _TEMPLATE)
    _MIGRATED_SCRIPTS[migrations] = script
    return script


def dispose_when_returned(engine: Engine, timeout_s: float = 5.0) -> None:
    """Dispose of `engine` once its connections are back in its pool (for at most `timeout_s`).

    A connection still checked out, by a thread of this process finishing its work after the
    test's own tasks ended (a worker's projection write outliving its cancelled activity),
    goes back to the disposed pool and is never closed: psycopg warns when it is collected, in
    whatever test runs then (a fresh-clone CI failed a relay test on such a warning)."""
    deadline = time.monotonic() + timeout_s
    pool = engine.pool
    while isinstance(pool, QueuePool) and pool.checkedout() and time.monotonic() < deadline:
        time.sleep(0.01)
    engine.dispose()


@contextmanager
def _postgres() -> Iterator[EngineFactory]:
    if os.environ.get("READMODEL_SKIP_POSTGRES") == "1":
        pytest.skip("READMODEL_SKIP_POSTGRES=1")
    admin = make_engine(POSTGRES_URL)
    try:
        with admin.connect() as connection:
            connection.execute(text("SELECT 1"))
    except OperationalError as err:
        admin.dispose()
        pytest.fail(
            f"PostgreSQL unreachable at {POSTGRES_URL} ({err.orig}); "
            "start it or set READMODEL_SKIP_POSTGRES=1"
        )
    prefix = f"test_{uuid.uuid4().hex[:12]}"
    schemas: set[str] = set()
    engines: list[Engine] = []

    def connect(name: str) -> Engine:
        schema = f"{prefix}_{name}"
        if schema not in schemas:
            with admin.begin() as connection:
                connection.execute(text(f'CREATE SCHEMA "{schema}"'))
            schemas.add(schema)
        # search_path is set per connection at connect time, so every pooled connection keeps it.
        engines.append(make_engine(f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"))
        return engines[-1]

    yield PostgresEngineFactory(connect, admin, lambda name: f"{prefix}_{name}")
    for engine in engines:
        dispose_when_returned(engine)
    with admin.begin() as connection:
        for schema in schemas:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def engine_factory(
    request: pytest.FixtureRequest, tmp_path: Path, sqlite_templates: Path
) -> Iterator[EngineFactory]:
    """Engines onto fresh databases of the parametrised kind."""
    kind = request.param
    with _sqlite(tmp_path, sqlite_templates) if kind == "sqlite" else _postgres() as factory:
        yield factory


@pytest.fixture
def engine(engine_factory: EngineFactory) -> Engine:
    """A fresh read model with its schema, on SQLite and on PostgreSQL."""
    return engine_factory.migrated("readmodel")


@pytest.fixture
def postgres_engine() -> Iterator[Engine]:
    """A fresh read model on PostgreSQL only, for behaviour SQLite gets by design."""
    with _postgres() as factory:
        yield factory.migrated("readmodel")
