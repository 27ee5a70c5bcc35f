"""Async projectors on SQLite and PostgreSQL: checkpoints, no double counts however batches are
repeated or raced, faulting after five failures while the others go on, and rebuilds."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from durable_outbox_temporal.contract.aggregate import RecordedEvent, StoreEvents
from sqlalchemy import Connection, Engine, select, text

from examples.labour.projectors import LABOUR_HISTORY, LABOUR_HISTORY_PROJECTOR
from readmodel import aggregates as event_store
from readmodel.aggregates import EVENT_STORE_LOCK_KEY
from readmodel.db import create_schema
from readmodel.models import PROJECTOR_CHECKPOINTS
from readmodel.projectors import base as projectors
from readmodel.projectors.base import FAULT_AFTER, AsyncProjector, StoredEvent
from service.aggregate_types import load_aggregate_types
from tests.readmodel.conftest import EngineFactory

T0 = datetime(2026, 11, 24, 9, tzinfo=UTC)
LABOUR = LABOUR_HISTORY_PROJECTOR
# The labour example's table comes with its own migrations.
MIGRATIONS = load_aggregate_types("examples.labour:LABOUR").migrations


@pytest.fixture
def engine(engine_factory: EngineFactory) -> Engine:
    """A fresh read model with the labour example's table, on SQLite and on PostgreSQL."""
    return engine_factory.migrated("readmodel", MIGRATIONS)


def store(engine: Engine, labour: str, *events: tuple[str, dict[str, Any]], first: int = 1) -> None:
    recorded = [
        RecordedEvent(seq=seq, type=kind, data=data, recorded_at=T0 + timedelta(minutes=seq))
        for seq, (kind, data) in enumerate(events, start=first)
    ]
    last = first + len(events) - 1
    event_store.store_events(
        engine, StoreEvents("labour", labour, recorded, last, {}, T0 + timedelta(minutes=last))
    )


def a_labour(engine: Engine, labour: str, mother: str) -> None:
    """Planned, two subscribers approved (one twice, one removed), 2 contractions, 3 updates
    (one an announcement), completed."""
    store(
        engine,
        labour,
        ("LabourPlanned", {"mother": mother, "mother_name": "Ada", "contact": {}}),
        ("SubscriberApproved", {"subscriber": "s1", "role": "observer"}),
        ("SubscriberApproved", {"subscriber": "s1", "role": "birth_partner"}),
        ("SubscriberApproved", {"subscriber": "s2", "role": "observer"}),
        ("SubscriberRemoved", {"subscriber": "s2"}),
        ("ContractionStarted", {"by": "s1", "at": T0.isoformat()}),
        ("ContractionEnded", {"by": "s1", "at": T0.isoformat()}),
        ("ContractionStarted", {"by": "s1", "at": T0.isoformat()}),
        ("UpdatePosted", {"by": "s1", "message": "a", "kind": "status", "at": T0.isoformat()}),
        ("UpdatePosted", {"by": "s1", "message": "b", "kind": "status", "at": T0.isoformat()}),
        (
            "UpdatePosted",
            {"by": "m1", "message": "c", "kind": "announcement", "at": T0.isoformat()},
        ),
        ("LabourCompleted", {"at": (T0 + timedelta(hours=5)).isoformat()}),
    )


def drain(engine: Engine, projector: AsyncProjector = LABOUR, limit: int = 500) -> int:
    """Batches until one applies nothing; how many events were applied in all."""
    total = 0
    while applied := projectors.project_batch(engine, projector, limit):
        total += applied
    return total


def history(engine: Engine, mother: str) -> list[dict[str, Any]]:
    found, _ = projectors.rows(engine, LABOUR, {"mother": mother})
    return [{k: v for k, v in row.items() if k != "planned_at"} for row in found]


def test_labour_history_per_mother(engine: Engine) -> None:
    a_labour(engine, "lab-1", "m1")
    a_labour(engine, "lab-2", "m1")
    store(engine, "lab-3", ("LabourPlanned", {"mother": "m2", "mother_name": "Bea", "contact": {}}))
    store(engine, "stray", ("UpdatePosted", {"kind": "status"}))  # never planned: no row

    assert drain(engine, limit=5) == 26

    [first, second] = history(engine, "m1")
    assert first == second | {"labour_id": "lab-1"}
    assert first == {
        "labour_id": "lab-1",
        "mother": "m1",
        "mother_name": "Ada",
        "status": "completed",
        "contractions": 2,
        "updates": 3,
        "announcements": 1,
        "subscribers": ["s1"],
        "completed_at": T0 + timedelta(hours=5),
        "last_seq": 12,
    }
    assert [row["status"] for row in history(engine, "m2")] == ["planned"]
    status = projectors.status(engine, LABOUR)
    assert (status.status, status.lag, status.consecutive_failures) == ("running", 0, 0)
    assert status.position > 0


def test_repeated_and_concurrent_batches_never_double_count(engine_factory: EngineFactory) -> None:
    engine = engine_factory("readmodel")
    create_schema(engine, MIGRATIONS)
    for n in range(20):
        a_labour(engine, f"lab-{n:02}", "m1")
    # Four "processes" (engines of their own) race through the same events in small batches.
    engines = [engine_factory("readmodel") for _ in range(4)]
    with ThreadPoolExecutor(4) as pool:
        applied = sum(pool.map(lambda e: drain(e, limit=7), engines))

    assert applied == 20 * 12
    assert drain(engine) == 0
    rows = history(engine, "m1")
    assert len(rows) == 20
    assert {(r["contractions"], r["updates"], r["announcements"]) for r in rows} == {(2, 3, 1)}


def test_a_failing_projector_faults_after_five_and_a_rebuild_restarts_it(engine: Engine) -> None:
    failures = {"left": FAULT_AFTER + 2}

    def flaky(connection: Connection, event: StoredEvent) -> None:
        if failures["left"] > 0:
            failures["left"] -= 1
            raise RuntimeError("the read model's table is locked")
        LABOUR.apply(connection, event)

    broken = AsyncProjector("broken", LABOUR.aggregate_types, flaky, LABOUR_HISTORY)
    a_labour(engine, "lab-1", "m1")

    for attempt in range(1, FAULT_AFTER + 1):
        with pytest.raises(RuntimeError):
            projectors.project_batch(engine, broken)
        outcome = projectors.record_failure(engine, "broken", "RuntimeError: locked")
        assert outcome == ("faulted" if attempt == FAULT_AFTER else "running")
    # Faulted: it stops, and the other projector goes on.
    assert projectors.project_batch(engine, broken) == 0
    assert drain(engine) == 12
    status = projectors.status(engine, broken)
    assert (status.status, status.consecutive_failures, status.lag) == ("faulted", 5, 12)
    assert status.last_error == "RuntimeError: locked"

    # A rebuild empties its table (shared with labour_history here) and starts over.
    projectors.rebuild(engine, broken)
    assert history(engine, "m1") == []
    for _ in range(2):  # the last two scripted failures, below the threshold
        with pytest.raises(RuntimeError):
            projectors.project_batch(engine, broken)
        projectors.record_failure(engine, "broken", "RuntimeError: locked")
    assert drain(engine, broken) == 12
    status = projectors.status(engine, broken)
    assert (status.status, status.consecutive_failures, status.last_error) == ("running", 0, None)
    assert status.rebuilt_at is not None
    assert history(engine, "m1")[0]["contractions"] == 2


def test_rebuild_gives_the_same_rows_and_never_goes_backwards(engine: Engine) -> None:
    a_labour(engine, "lab-1", "m1")
    drain(engine)
    before = history(engine, "m1")

    projectors.rebuild(engine, LABOUR)
    assert projectors.status(engine, LABOUR).lag == 12
    drain(engine)
    # The same events applied again by hand are skipped by the row's last_seq.
    with engine.begin() as connection:
        LABOUR.apply(
            connection,
            StoredEvent(1, "labour", "lab-1", 6, "ContractionStarted", {}, T0),
        )

    assert history(engine, "m1") == before


def test_rows_refuse_a_filter_the_projector_lacks(engine: Engine) -> None:
    with pytest.raises(KeyError, match="colour"):
        projectors.rows(engine, LABOUR, {"colour": "red"})
    for n in range(5):
        a_labour(engine, f"lab-{n}", "m1")
    drain(engine)
    page, after = projectors.rows(engine, LABOUR, {"mother": "m1"}, limit=3)
    rest, end = projectors.rows(engine, LABOUR, {"mother": "m1"}, after=after, limit=3)
    assert [r["labour_id"] for r in page + rest] == [f"lab-{n}" for n in range(5)]
    assert end is None


def test_an_idle_or_faulted_projector_does_not_wait_for_the_write_lock(engine: Engine) -> None:
    a_labour(engine, "lab-1", "m1")
    drain(engine)
    broken = AsyncProjector("broken", LABOUR.aggregate_types, LABOUR.apply, LABOUR_HISTORY)
    for _ in range(FAULT_AFTER):
        projectors.record_failure(engine, "broken", "RuntimeError: locked")

    # Another writer holds the checkpoints: SQLite's one write lock, PostgreSQL's row locks.
    holder = engine.connect()
    if engine.dialect.name == "sqlite":
        holder.exec_driver_sql("BEGIN IMMEDIATE")
    else:
        holder.begin()
        holder.execute(select(PROJECTOR_CHECKPOINTS).with_for_update()).all()
    try:
        with ThreadPoolExecutor(2) as pool:
            idle = pool.submit(projectors.project_batch, engine, LABOUR)
            faulted = pool.submit(projectors.project_batch, engine, broken)
            try:
                # Polls twice a second must not queue behind (or hold up) the real writers.
                assert (idle.result(timeout=5), faulted.result(timeout=5)) == (0, 0)
            finally:
                holder.rollback()
    except FutureTimeout:
        pytest.fail("a projector with nothing to do waited for the checkpoint's lock")
    finally:
        holder.close()


def test_event_store_writers_take_turns_on_postgres(postgres_engine: Engine) -> None:
    # So ids commit in order: a projector past id N never meets a lower id committing later.
    holder = postgres_engine.connect()
    holder.begin()
    holder.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": EVENT_STORE_LOCK_KEY})
    with ThreadPoolExecutor(1) as pool:
        writing = pool.submit(a_labour, postgres_engine, "lab-1", "m1")
        try:
            with pytest.raises(FutureTimeout):
                writing.result(timeout=0.5)
        finally:
            holder.rollback()
            holder.close()
        writing.result(timeout=10)
    assert projectors.status(postgres_engine, LABOUR).lag == 12
