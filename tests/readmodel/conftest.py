"""The read model runs on SQLite and on PostgreSQL: every test here runs on both.

PostgreSQL is expected at `READMODEL_POSTGRES_URL` (trust auth); when it is unreachable its tests
fail, unless `READMODEL_SKIP_POSTGRES=1` says this machine has none.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError

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

    yield EngineFactory(connect)
    for engine in engines:
        engine.dispose()
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
        engine = factory("readmodel")
        create_schema(engine)
        yield engine
