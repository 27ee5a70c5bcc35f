"""The claim-check pruner's rule (`readmodel.payload_store.prune_orphaned_blobs`), on SQLite
and PostgreSQL: a blob goes once no run Temporal still has can read it, a long-lived workflow's
run by run. What the real Temporal answers: `tests/test_claim_checks.py`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select, update
from temporalio.api.common.v1 import Payload
from temporalio.converter import StorageDriverStoreContext, StorageDriverWorkflowInfo

from readmodel.models import PAYLOAD_BLOBS
from readmodel.payload_store import SqlPayloadStore, TemporalRuns, prune_orphaned_blobs


def payload(text: str) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=text.encode())


async def test_a_long_lived_workflows_blobs_go_once_no_run_it_still_has_can_read_them(
    engine,
) -> None:
    """A bulk shard or an aggregate keeps its workflow id for ever, one run after another: its
    blobs go as the runs that read them leave Temporal (scripted runs here; the queries the
    real ones make are the next test's), where they stayed for as long as the id lived."""
    store = SqlPayloadStore(engine)
    now = datetime.now(UTC)
    hour = timedelta(hours=1)
    stored = {
        # owner: blob ages in hours
        "bulk/shard/0": [9, 8, 7, 6, 5, 4],  # runs since 6.5 h ago: the 9 and 8 h old go
        "aggregate/long-run": [6, 5],  # its one run started 7 h ago: all stay
        "bulk/gone/0": [3, 2],  # Temporal has no run of it: all go
    }
    for owner, ages in stored.items():
        for age in ages:
            [claim] = await store.store(
                StorageDriverStoreContext(
                    target=StorageDriverWorkflowInfo(namespace="default", id=owner)
                ),
                [payload(f'"{owner} {age}"')],
            )
            with engine.begin() as connection:
                connection.execute(
                    update(PAYLOAD_BLOBS)
                    .where(PAYLOAD_BLOBS.c.digest == claim.claim_data["digest"])
                    .values(stored_at=now - age * hour)
                )
    run_starts = {
        "bulk/shard/0": [now - 6.5 * hour, now - 3 * hour, now - 0.1 * hour],
        "aggregate/long-run": [now - 7 * hour],
    }
    asked: list[str] = []

    async def current_start(owner: str) -> datetime | None:
        starts = run_starts.get(owner)
        return starts[-1] if starts else None

    async def started_by(owner: str, at: datetime) -> bool:
        asked.append(owner)
        return any(start <= at for start in run_starts.get(owner, []))

    pruned = await prune_orphaned_blobs(engine, TemporalRuns(current_start, started_by))

    with engine.connect() as connection:
        left = {
            Payload.FromString(data).data.decode().strip('"')
            for data in connection.execute(select(PAYLOAD_BLOBS.c.data)).scalars()
        }
    assert pruned == 4
    assert left == {
        *(f"bulk/shard/0 {age}" for age in (7, 6, 5, 4)),
        "aggregate/long-run 6",
        "aggregate/long-run 5",
    }
    # A search over the shard's six blob times; no query for the others.
    assert asked == ["bulk/shard/0"] * len(asked) and len(asked) <= 3
