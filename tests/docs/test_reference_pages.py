"""The generated reference pages under docs/reference/ are current, and `--check` says when not."""

from __future__ import annotations

from pathlib import Path

import pytest

from devstack.reference_docs import COMMAND, PAGES, REFERENCE_DIR, main, stale_pages


@pytest.mark.parametrize("name", PAGES)
def test_the_committed_page_is_what_the_code_generates(name: str) -> None:
    committed = (REFERENCE_DIR / name).read_text()

    assert committed == PAGES[name](), f"docs/reference/{name} is stale: run {COMMAND}"


def test_check_mode_passes_on_the_committed_pages() -> None:
    assert main(["--check"]) == 0, f"run {COMMAND}"


def test_a_stale_or_missing_page_is_reported(tmp_path: Path) -> None:
    for name, generate in PAGES.items():
        (tmp_path / name).write_text(generate())
    (tmp_path / "cli.md").write_text((tmp_path / "cli.md").read_text() + "hand-edited\n")
    (tmp_path / "metrics.md").unlink()

    assert stale_pages(tmp_path) == ["cli.md", "metrics.md"]


def test_the_pages_carry_what_their_sources_define() -> None:
    configuration, rest, cli, metrics = (
        PAGES[name]() for name in ("configuration.md", "rest-api.md", "cli.md", "metrics.md")
    )

    assert "| `CLAIM_CHECK_BYTES` | integer, ≥ 0 | `65536` |" in configuration
    assert "| `shards` | integer, ≥ 1, ≤ 64 | `4` |" in configuration
    assert '| `mode` | `"item"` or `"bulk"` | `"item"` |' in configuration
    assert "| `POST` | `/v1/outboxes/{outbox}/items` | Enqueue one item | 200, 202 |" in rest
    assert "`PurgeRequest` (optional)" in rest
    assert "## `outbox schedules create`" in cli and "`--every EVERY`" in cli
    assert "| `outbox_http_requests_total` | counter | `method`, `route`, `status` |" in metrics
    assert "| `outbox_backlog_scrape_ok` | gauge | — |" in metrics
