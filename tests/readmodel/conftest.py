"""The read model runs on SQLite and on PostgreSQL: every test here runs on both.

PostgreSQL is expected at `READMODEL_POSTGRES_URL` (trust auth); when it is unreachable its tests
fail, unless `READMODEL_SKIP_POSTGRES=1` says this machine has none.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError

from readmodel.db import create_schema, make_engine

POSTGRES_URL = os.environ.get(
    "READMODEL_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)

# Makes an engine onto the test's own empty database of that name (a file, or a schema), without
# creating any table; every call makes a new engine, as another process would.
EngineFactory = Callable[[str], Engine]


@contextmanager
def _sqlite(tmp_path: Path) -> Iterator[EngineFactory]:
    engines: list[Engine] = []

    def factory(name: str) -> Engine:
        engines.append(make_engine(f"sqlite:///{tmp_path / 'readmodel' / name}.db"))
        return engines[-1]

    yield factory
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

    def factory(name: str) -> Engine:
        schema = f"{prefix}_{name}"
        if schema not in schemas:
            with admin.begin() as connection:
                connection.execute(text(f'CREATE SCHEMA "{schema}"'))
            schemas.add(schema)
        # search_path is set per connection at connect time, so every pooled connection keeps it.
        engines.append(make_engine(f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"))
        return engines[-1]

    yield factory
    for engine in engines:
        engine.dispose()
    with admin.begin() as connection:
        for schema in schemas:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def engine_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EngineFactory]:
    """Engines onto fresh, empty databases of the parametrised kind."""
    with _sqlite(tmp_path) if request.param == "sqlite" else _postgres() as factory:
        yield factory


@pytest.fixture
def engine(engine_factory: EngineFactory) -> Engine:
    """A fresh read model with its schema, on SQLite and on PostgreSQL."""
    engine = engine_factory("readmodel")
    create_schema(engine)
    return engine


@pytest.fixture
def postgres_engine() -> Iterator[Engine]:
    """A fresh read model on PostgreSQL only, for behaviour SQLite gets by design."""
    with _postgres() as factory:
        engine = factory("readmodel")
        create_schema(engine)
        yield engine
