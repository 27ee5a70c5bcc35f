"""Replay recorded histories: a change that makes the workflow non-deterministic fails here.

Histories (items, lanes and aggregates) are recorded from the lifecycle tests with
`RECORD_HISTORIES=1 make test` and committed under `tests/histories/`; record new ones whenever a
workflow gains a new path.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from tests.conftest import SEED_TYPES
from worker import WORKFLOWS
from workflows.aggregate_types import host

HISTORIES = sorted((Path(__file__).parent.parent / "histories").glob("*.json"))


def test_histories_are_recorded() -> None:
    assert len(HISTORIES) >= 5, "record histories with RECORD_HISTORIES=1 (see module docstring)"


@pytest.mark.parametrize("path", HISTORIES, ids=[path.stem for path in HISTORIES])
async def test_history_replays_deterministically(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    host(SEED_TYPES.definitions)  # the types the aggregates' histories were recorded with
    await Replayer(workflows=WORKFLOWS).replay_workflow(history)
