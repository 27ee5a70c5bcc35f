"""The `outbox` CLI's default API: `OUTBOX_API_URL`, else the running dev stack's recorded
address (on whatever `DEV_API_PORT` it was started), else `make dev`'s default port."""

from __future__ import annotations

from pathlib import Path

import cli
from configuration.api_address import API_URL_FILE, default_api_url


def test_outbox_api_url_wins(tmp_path: Path) -> None:
    (tmp_path / API_URL_FILE).write_text("http://127.0.0.1:18000\n")
    environ = {"OUTBOX_API_URL": "https://outbox.example.com", "DEV_DATA_DIR": str(tmp_path)}

    assert default_api_url(environ) == "https://outbox.example.com"


def test_a_running_dev_stacks_address_comes_next(tmp_path: Path) -> None:
    (tmp_path / API_URL_FILE).write_text("http://127.0.0.1:18000\n")

    assert default_api_url({"DEV_DATA_DIR": str(tmp_path)}) == "http://127.0.0.1:18000"


def test_without_a_stack_the_dev_api_port_then_8000(tmp_path: Path) -> None:
    environ = {"DEV_DATA_DIR": str(tmp_path)}

    assert default_api_url(environ) == "http://127.0.0.1:8000"
    assert default_api_url({**environ, "DEV_API_PORT": "18001"}) == "http://127.0.0.1:18001"


def test_the_cli_defaults_to_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("OUTBOX_API_URL", raising=False)
    monkeypatch.setenv("DEV_DATA_DIR", str(tmp_path))
    (tmp_path / API_URL_FILE).write_text("http://127.0.0.1:18002\n")
    called = []
    monkeypatch.setattr(cli, "status", lambda args: called.append(args.api))

    cli.main(["status", "demo", "k1"])

    assert called == ["http://127.0.0.1:18002"]
