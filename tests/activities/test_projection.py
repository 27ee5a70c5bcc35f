"""The projection activity, run as Temporal runs it, writes the read model idempotently."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from typing import Any

import pytest
from durable_outbox_temporal.contract.item import ItemProjection
from sqlalchemy import Engine, event
from temporalio.converter import DataConverter
from temporalio.testing import ActivityEnvironment

from activities.projection import ProjectionActivities
from readmodel import store
from tests.readmodel.test_store import lifecycle


async def through_converter(projection: ItemProjection) -> ItemProjection:
    """The projection as the activity receives it: serialised by the workflow, decoded here."""
    payloads = await DataConverter.default.encode([projection])
    [decoded] = await DataConverter.default.decode(payloads, [ItemProjection])
    assert isinstance(decoded, ItemProjection)
    return decoded


async def test_activity_projects_each_transition_once(engine: Engine) -> None:
    activities = ProjectionActivities(engine)
    env = ActivityEnvironment()
    projections = [await through_converter(p) for p in lifecycle("k")]

    for projection in projections:
        await env.run(activities.project_item, projection)
    # A replayed workflow resends everything; a late retry resends the first projection.
    for projection in [*projections, projections[0]]:
        await env.run(activities.project_item, projection)

    row = store.get_item(engine, "outbox/o/k")
    assert row is not None
    assert (row.view.status, row.view.last_event_seq, row.view.poll_count) == ("sent", 4, 1)
    assert row.payload == {"to": "a@b.c"}
    events = store.item_events(engine, "outbox/o/k")
    assert [(e.seq, e.type) for e in events] == [
        (1, "enqueued"),
        (2, "accepted"),
        (3, "polled"),
        (4, "sent"),
    ]
    assert events[-1].at == projections[-1].events[-1].at


async def test_activity_does_the_database_work_off_the_event_loop(engine: Engine) -> None:
    loop_thread = threading.get_ident()
    statement_threads: set[int] = set()

    @event.listens_for(engine, "before_cursor_execute")
    def record_thread(*_: Any) -> None:
        statement_threads.add(threading.get_ident())

    await ActivityEnvironment().run(ProjectionActivities(engine).project_item, lifecycle("k")[0])

    assert statement_threads and loop_thread not in statement_threads


async def test_concurrent_activities_share_transactions(engine: Engine) -> None:
    activities = ProjectionActivities(engine)
    projections = [p for n in range(40) for p in lifecycle(f"k{n}")]

    await asyncio.gather(
        *(ActivityEnvironment().run(activities.project_item, p) for p in projections)
    )

    assert activities.transactions < len(projections) / 4
    for n in range(40):
        row = store.get_item(engine, f"outbox/o/k{n}")
        assert row is not None and row.view.status == "sent" and row.payload == {"to": "a@b.c"}
        assert [e.seq for e in store.item_events(engine, f"outbox/o/k{n}")] == [1, 2, 3, 4]


async def test_a_bad_projection_fails_only_its_own_activity(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    activities = ProjectionActivities(engine)
    good = lifecycle("good")[0]
    # No creation time anywhere: the store refuses it (created_at is the list's keyset).
    bad = replace(lifecycle("bad")[0], events=[], enqueued_at=None)
    bad.view = replace(bad.view, created_at=None)

    outcomes = await asyncio.gather(
        ActivityEnvironment().run(activities.project_item, bad),
        ActivityEnvironment().run(activities.project_item, good),
        return_exceptions=True,
    )

    assert "batch of 2 projections failed" in caplog.text  # they did share a batch
    assert isinstance(outcomes[0], ValueError) and outcomes[1] is None
    assert store.get_item(engine, "outbox/o/good") is not None
    assert store.get_item(engine, "outbox/o/bad") is None
