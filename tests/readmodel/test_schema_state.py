"""The read model says when its schema is behind the code: the revision it is at against this
code's heads, and the table or column a statement missed, on SQLite and PostgreSQL alike."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from readmodel.db import missing_schema_object, schema_not_at_head
from tests.readmodel.conftest import EngineFactory


def statement_error(engine: Engine, statement: str) -> DBAPIError:
    with pytest.raises(DBAPIError) as failed, engine.connect() as connection:
        connection.execute(text(statement))
    return failed.value


def test_a_migrated_schema_is_at_head(engine: Engine) -> None:
    assert schema_not_at_head(engine) is None


def test_an_older_revision_is_named_with_the_heads_and_the_way_there(engine: Engine) -> None:
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = '0017'"))

    behind = schema_not_at_head(engine)

    assert behind is not None
    assert "at revision 0017, not at this code's head " in behind
    assert "`alembic upgrade heads`" in behind


def test_an_empty_database_has_no_revision(engine_factory: EngineFactory) -> None:
    behind = schema_not_at_head(engine_factory("empty"))

    assert behind is not None and "none (no `alembic_version` table)" in behind


def test_a_missing_table_and_column_are_named(engine: Engine) -> None:
    no_table = statement_error(engine, "SELECT * FROM table_of_a_newer_release")
    no_column = statement_error(engine, "SELECT column_of_a_newer_release FROM outbox_items")

    assert missing_schema_object(no_table) == 'table "table_of_a_newer_release"'
    assert missing_schema_object(no_column) == 'column "column_of_a_newer_release"'


def test_other_database_errors_are_not_a_schema_problem(engine: Engine) -> None:
    assert missing_schema_object(statement_error(engine, "SELEC 1")) is None
