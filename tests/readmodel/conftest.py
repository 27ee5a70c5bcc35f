"""The read model runs on SQLite and on PostgreSQL: every test here runs on both."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from readmodel.db import create_schema, make_engine

POSTGRES_URL = os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture(params=["sqlite", "postgres"])
def store_engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """A fresh, empty read model; on PostgreSQL a schema of its own, dropped afterwards."""
    if request.param == "sqlite":
        engine = make_engine(f"sqlite:///{tmp_path / 'readmodel.db'}")
        create_schema(engine)
        yield engine
        engine.dispose()
        return
    schema = f"test_{uuid.uuid4().hex[:12]}"
    admin = make_engine(POSTGRES_URL)
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    # The schema is chosen per connection at connect time, so pooled connections keep it.
    engine = make_engine(f"{POSTGRES_URL}?options=-csearch_path%3D{schema}")
    create_schema(engine)
    yield engine
    engine.dispose()
    with admin.begin() as connection:
        connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    admin.dispose()
