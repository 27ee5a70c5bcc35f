"""Alembic environment of the read model; `target_metadata` is what autogenerate compares with.

`readmodel.db.create_schema` runs it on its own connection, already under the schema lock. The
`alembic` command (alembic.ini at the repository root) runs it on `DATABASE_URL`, or else on the
ini's `sqlalchemy.url`.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection

from readmodel.db import make_engine, normalise_url, schema_lock
from readmodel.models import metadata


def _migrate(connection: Connection) -> None:
    # Batch mode: SQLite alters little in place, so autogenerate writes table copies for it.
    context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def _database_url() -> str:
    url = os.environ.get("DATABASE_URL") or context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("set DATABASE_URL or sqlalchemy.url in alembic.ini")
    return normalise_url(url)


def _run() -> None:
    if context.config.config_file_name is not None:  # the command line: its logging sections
        fileConfig(context.config.config_file_name)
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _migrate(connection)
    elif context.is_offline_mode():
        context.configure(url=_database_url(), target_metadata=metadata, literal_binds=True)
        with context.begin_transaction():
            context.run_migrations()
    else:
        engine = make_engine(_database_url())
        try:
            with schema_lock(engine) as locked:
                _migrate(locked)
        finally:
            engine.dispose()


_run()
