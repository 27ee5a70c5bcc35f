"""`docs/how-to/run-in-production.md` runs as written: its `bash` blocks, in order, on ports of
their own and a fresh PostgreSQL database, each long-running one (`# Terminal: <name> (keeps
running)`) in the background as its own terminal would, the rest to completion. The production
processes start (so nothing is open: they refuse otherwise) and one item reaches the fake
provider, signed with the private credentials the page generates."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import text

from configuration.settings import (
    PROJECT_ROOT,
    PUBLIC_ACS_ACCESS_KEY,
    PUBLIC_PAYMENT_TOKEN,
    PUBLIC_WEBHOOK_SECRET,
)
from readmodel.db import make_engine
from tests.faults.test_faults import free_port
from tests.readmodel.conftest import POSTGRES_URL

PAGE = PROJECT_ROOT / "docs" / "how-to" / "run-in-production.md"
_BASH_BLOCK = re.compile(r"^```bash[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_TERMINAL = re.compile(r"^# Terminal: (\S+) \(keeps running\)$")
STEP_TIMEOUT_S = 180
# Whatever the caller's shell sets that the page's environment file must decide alone.
_PRODUCT_VARIABLES = {
    "API_TOKEN",
    "API_TOKENS_FILE",
    "PAYLOAD_KEYS",
    "PAYLOAD_KEYS_FILE",
    "ALLOW_INSECURE",
    "OUTBOX_ENV",
    "TEMPORAL_ADDRESS",
    "TEMPORAL_NAMESPACE",
    "FAKE_PROVIDER_URL",
    "FAKE_ACS_ACCESS_KEY",
    "FAKE_WEBHOOK_SECRET",
    "FAKE_PAYMENT_TOKEN",
    "FAKE_EMAIL_EVENTS_SECRET",
    "OUTBOX_CONFIG",
}


@dataclass(frozen=True)
class Step:
    """One `bash` block: a terminal's process that keeps running, or a command that ends."""

    script: str
    terminal: str | None


def steps(page: str) -> list[Step]:
    """The page's `bash` blocks, in order."""
    found = []
    for block in _BASH_BLOCK.findall(page):
        marker = _TERMINAL.match(block.splitlines()[0])
        found.append(Step(block, marker.group(1) if marker else None))
    return found


@pytest.fixture
def database() -> Iterator[str]:
    """A fresh, empty PostgreSQL database, dropped after the test."""
    name = f"recipe_{uuid.uuid4().hex[:12]}"
    admin = make_engine(POSTGRES_URL).execution_options(isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    yield POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    admin.dispose()


def test_the_page_has_each_process_and_the_steps_between() -> None:
    found = steps(PAGE.read_text())

    assert [step.terminal for step in found if step.terminal] == [
        "temporal",
        "fake",
        "worker",
        "api",
    ]
    assert found[-1].terminal is None and "first-item" in found[-1].script


def test_a_terminal_marker_is_read_from_the_blocks_first_line() -> None:
    page = "```bash\n# Terminal: api (keeps running)\nexec x\n```\n```bash\necho once\n```\n"

    assert steps(page) == [
        Step("# Terminal: api (keeps running)\nexec x\n", "api"),
        Step("echo once\n", None),
    ]


@pytest.mark.chaos
@pytest.mark.timeout(600)
def test_the_production_recipe_runs_as_written(tmp_path: Path, database: str) -> None:
    """Chaos: it starts a Temporal server, the fake, a worker and an API from scratch and waits
    for readiness and a delivery, a minute of wall clock or more on a loaded machine."""
    home = tmp_path / "outbox-production"
    fake_port = free_port()
    env = {key: value for key, value in os.environ.items() if key not in _PRODUCT_VARIABLES}
    env.update(
        # The page's `source .venv/bin/activate`: this interpreter's tools come first.
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        OUTBOX_HOME=str(home),
        DATABASE_URL=database,
        TEMPORAL_PORT=str(free_port()),
        TEMPORAL_UI_PORT=str(free_port()),
        API_PORT=str(free_port()),
        FAKE_PORT=str(fake_port),
        WORKER_METRICS_PORT=str(free_port()),
        PYTHONUNBUFFERED="1",
    )
    running: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for step in steps(PAGE.read_text()):
            if step.terminal is not None:
                # The child keeps its own copy of the file: ours closes at once.
                with (tmp_path / f"{step.terminal}.log").open("wb") as log:
                    running[step.terminal] = subprocess.Popen(
                        ["bash", "-euo", "pipefail", "-c", step.script],
                        cwd=PROJECT_ROOT,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                continue
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", step.script],
                cwd=PROJECT_ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=STEP_TIMEOUT_S,
            )
            exited = {name: p.returncode for name, p in running.items() if p.poll() is not None}
            assert done.returncode == 0 and not exited, (
                f"step failed ({done.returncode}; exited: {exited}):\n{step.script}\n"
                f"--- stdout\n{done.stdout[-2000:]}\n--- stderr\n{done.stderr[-2000:]}\n"
                + logs(tmp_path)
            )
        with urllib.request.urlopen(f"http://127.0.0.1:{fake_port}/_admin/stats") as answer:
            delivered = json.load(answer)["totals"]["deliveries"]
    finally:
        for process in reversed(running.values()):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in running.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    assert delivered == 1
    environment = (home / "env").read_text()
    assert "OUTBOX_ENV=production" in environment
    for public in (PUBLIC_ACS_ACCESS_KEY, PUBLIC_WEBHOOK_SECRET, PUBLIC_PAYMENT_TOKEN):
        assert public not in environment


def logs(directory: Path) -> str:
    """The last lines of each background process's output."""
    return "".join(
        f"--- {path.stem}\n{path.read_text(errors='replace')[-2000:]}\n"
        for path in sorted(directory.glob("*.log"))
    )
