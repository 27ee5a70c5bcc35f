"""A process whose code is older than the read model's schema (a rollback that left the newer
release's migrations applied) refuses to start: one message naming both revisions and the way
back, a non-zero exit, no traceback. The worker and the API, each as deployed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from configuration.settings import PROJECT_ROOT
from configuration.version import VERSION
from readmodel.db import create_schema, make_engine
from tests.faults.test_faults import free_port
from tests.readmodel.test_migrations import head_revision

NEWER_REVISION = "0999"
COMMANDS = {
    "worker": [sys.executable, "worker.py"],
    "api": [
        sys.executable,
        *("-m", "uvicorn", "api.main:create_app", "--factory", "--port", str(free_port())),
    ],
}


@pytest.fixture
def newer_schema(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'readmodel.db'}"
    engine = make_engine(url)
    create_schema(engine)
    with engine.begin() as connection:
        connection.execute(text(f"UPDATE alembic_version SET version_num = '{NEWER_REVISION}'"))
    engine.dispose()
    return url


@pytest.mark.parametrize("process", COMMANDS)
def test_a_process_older_than_the_schema_refuses_to_start(process: str, newer_schema: str) -> None:
    env = {**os.environ, "DATABASE_URL": newer_schema, "API_TOKEN": "", "OUTBOX_ENV": "development"}
    done = subprocess.run(
        COMMANDS[process], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "Traceback" not in output
    assert f"durable-outbox {VERSION} refuses to start" in output
    head = head_revision()
    assert f"revision {NEWER_REVISION}" in output and f"its newest: {head}" in output
    assert f"`alembic downgrade {head}`" in output and "docs/how-to/upgrade.md" in output
