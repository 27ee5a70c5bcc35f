"""Replay the archive of recorded histories: a change that makes a workflow non-deterministic
against any release's histories, or against those the code not yet released recorded, fails here.

The archive keeps one folder per release, `tests/histories/<version>/`, sealed by a `SHA256SUMS`
manifest and closed (`tests/test_history_archive.py` holds it so): the live workflows of a
release are exactly the histories its code recorded, so HEAD replays them all. The tests record
into `tests/histories/unreleased/` with `RECORD_HISTORIES=1` (re-recorded freely: no deployment
runs unreleased code), which HEAD replays too and which a release cut renames to the version;
`docs/how-to/upgrade.md` says when to record and seal.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer
from temporalio.workflow import _Definition

from tests.conftest import (
    HISTORIES_DIR,
    SEED_TYPES,
    UNRELEASED_HISTORIES,
    history_workflow_type,
)
from worker import WORKFLOWS, SandboxCheckingOnce
from workflows.aggregate_types import host

# The oldest release whose workflows may still be open where HEAD is deployed: an upgrade from
# anything older must first let them close (docs/how-to/upgrade.md). Raising it is how a
# `workflow.patched` branch becomes removable; the older folders stay in the archive.
OLDEST_OPEN_RELEASE = (0, 1, 0)


def _replayed(folder: Path) -> bool:
    if folder.name == UNRELEASED_HISTORIES:
        return True
    return tuple(int(part) for part in folder.name.split(".")) >= OLDEST_OPEN_RELEASE


HISTORIES = sorted(path for path in HISTORIES_DIR.glob("*/*.json") if _replayed(path.parent))


def test_histories_are_recorded() -> None:
    releases = {path.parent.name for path in HISTORIES}
    assert "0.1.0" in releases, "the first release's histories are the archive's floor"
    assert len(HISTORIES) >= 70


def test_every_workflow_type_has_histories_to_replay() -> None:
    recorded = {history_workflow_type(path.read_text()) for path in HISTORIES}
    hosted = {str(_Definition.must_from_class(workflow).name) for workflow in WORKFLOWS}
    missing = sorted(hosted - recorded)
    assert not missing, f"no history of {missing}: a test of each records one (record_history)"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def replayer() -> Replayer:
    """One replayer for the process's cases. Each case replays its own history, so four test
    processes share the archive's replays rather than each replaying it whole; the sandbox checks
    each workflow type once per process (`worker.SandboxCheckingOnce`), where a replayer checked
    every type again for each history (docs/decisions/parallel-tests.md)."""
    host(SEED_TYPES.definitions)  # the types the aggregates' histories were recorded with
    return Replayer(workflows=WORKFLOWS, workflow_runner=SandboxCheckingOnce())


@pytest.mark.parametrize(
    "path", HISTORIES, ids=[f"{path.parent.name}/{path.stem}" for path in HISTORIES]
)
async def test_history_replays_deterministically(path: Path, replayer: Replayer) -> None:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    await replayer.replay_workflow(history)
