"""The retention run and its schedule: a run plans the rules from the worker's destinations and
prunes payloads past the payload retention, rows past the item retention, and idle lanes past
the longest item retention, leaving the rest
(time-skipping server); the worker's schedule is created once, runs on a trigger, and a worker
starting again brings its interval up to date without undoing an operator's pause (dev server:
the time-skipping server has no schedules)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from durable_outbox_temporal.contract.ids import lane_workflow_id
from durable_outbox_temporal.contract.item import (
    ItemEvent,
    ItemEventType,
    ItemProjection,
    ItemStatus,
)
from durable_outbox_temporal.contract.lane import LanePolicy, LaneProjection, LaneStatus, LaneView
from durable_outbox_temporal.contract.retention import (
    RETENTION_WORKFLOW_TYPE,
    RetentionInput,
    RetentionProgress,
    retention_schedule_id,
)
from sqlalchemy import Engine
from temporalio.client import ScheduleActionExecutionStartWorkflow, ScheduleActionStartWorkflow

from activities.retention import ensure_retention_schedule
from readmodel import store
from readmodel.lanes import apply_lane_projections, get_lane
from readmodel.permits import take_requests
from tests.conftest import Stack, webhook_destination
from tests.readmodel.test_store import view
from tests.workflows.test_lane import wait_for
from worker import default_operations_task_queue

DAY = timedelta(days=1)
KEPT = {
    "payload_retention_s": 4 * DAY.total_seconds(),
    "item_retention_s": 10 * DAY.total_seconds(),
}


def ended(
    engine: Engine, destination: str, key: str, days_ago: float | None, now: datetime | None = None
) -> str:
    """An item of `destination` with a payload, ended that many days before `now` (the Temporal
    server's time, which a time-skipping server has moved on; default the clock's) or queued
    (None)."""
    now = now or datetime.now(UTC)
    status = ItemStatus.QUEUED if days_ago is None else ItemStatus.SENT
    finished = None if days_ago is None else now - days_ago * DAY
    events = [ItemEvent(1, ItemEventType.ENQUEUED, ItemStatus.QUEUED, now - 30 * DAY)]
    if days_ago is not None:
        events.append(ItemEvent(2, ItemEventType.SENT, status, finished or now))
    projected = view(
        key,
        len(events),
        status,
        outbox="ret",
        destination=destination,
        created_at=now - 30 * DAY,
        finished_at=finished,
    )
    store.apply_projection(
        engine, ItemProjection(projected, events, now - 30 * DAY, payload={"k": key})
    )
    return projected.id


async def test_a_run_prunes_payloads_then_rows_past_their_retention(
    stack_factory: Any, fake_provider: Any
) -> None:
    destination = webhook_destination(fake_provider, **KEPT)
    stack: Stack = await stack_factory(destination)
    engine, name = stack.engine, destination.name
    # The run cuts off at the server's time: earlier tests have skipped it ahead of the clock.
    now = await stack.env.get_current_time()
    fresh = ended(engine, name, "fresh", days_ago=1, now=now)
    old = ended(engine, name, "old", days_ago=5, now=now)
    ancient = ended(engine, name, "ancient", days_ago=20, now=now)
    waiting = ended(engine, name, "waiting", days_ago=None, now=now)
    # Lanes idle past the longest item retention (10 days) go; a recent or halted one stays.
    lanes = {key: uuid.uuid4().hex[:8] for key in ("idle", "recent", "halted")}
    idle_lane(engine, lanes["idle"], now - 20 * DAY)
    idle_lane(engine, lanes["recent"], now - DAY)
    idle_lane(engine, lanes["halted"], now - 20 * DAY, LaneStatus.HALTED)
    # A quota's scope used once, long ago, and never again: the plan sweeps its count (counts
    # are by the workers' clocks, not the server's).
    stale = datetime.now(UTC) - 3 * DAY
    take_requests(engine, [(f"gone-{uuid.uuid4().hex[:8]}", [(DAY, 10)])], stale)

    run_id = f"retention-test/{uuid.uuid4().hex}"
    handle = await stack.client.start_workflow(
        RETENTION_WORKFLOW_TYPE,
        RetentionInput(default_operations_task_queue(stack.task_queue)),
        id=run_id,
        task_queue=stack.task_queue,
        result_type=RetentionProgress,
    )
    progress = await handle.result()

    assert progress.done and progress.failure is None
    # The ancient one loses its payload first, then its row.
    assert (progress.payloads_pruned, progress.rows_pruned) == (2, 1)
    assert progress.rules is not None and [rule.destination for rule in progress.rules] == [name]
    for item_id in (fresh, waiting):
        record = store.get_item(engine, item_id)
        assert record is not None and record.payload is not None, item_id
    pruned = store.get_item(engine, old)
    assert pruned is not None and pruned.payload is None and pruned.payload_pruned_at
    assert store.get_item(engine, ancient) is None
    assert isinstance(store.item_or_remembered_key(engine, ancient), store.RememberedKey)
    assert progress.lane_retention_s == KEPT["item_retention_s"] and progress.lanes_pruned >= 1
    assert get_lane(engine, "ret", lanes["idle"]) is None
    assert get_lane(engine, "ret", lanes["recent"]) is not None
    assert get_lane(engine, "ret", lanes["halted"]) is not None
    assert progress.flow_counts_swept >= 1
    await stack.record_history(run_id)


def idle_lane(
    engine: Engine, ordering_key: str, at: datetime, status: LaneStatus = LaneStatus.IDLE
) -> None:
    """A lane's row, last changed at `at`."""
    view = LaneView(
        id=lane_workflow_id("ret", ordering_key),
        outbox="ret",
        ordering_key=ordering_key,
        status=status,
        policy=LanePolicy.HALT,
        updated_at=at,
        version=int(at.timestamp() * 1_000_000),
    )
    apply_lane_projections(engine, [LaneProjection(view)])


async def test_the_worker_keeps_one_schedule_up_to_date_and_it_runs(
    dev_env: Any, stack_factory: Any, fake_provider: Any
) -> None:
    destination = webhook_destination(fake_provider, **KEPT)
    stack: Stack = await stack_factory(destination, env=dev_env)
    old = ended(stack.engine, destination.name, "old", days_ago=5)
    operations = default_operations_task_queue(stack.task_queue)
    schedule_id = await ensure_retention_schedule(
        stack.client, stack.task_queue, operations, timedelta(hours=1)
    )
    schedule = stack.client.get_schedule_handle(schedule_id)
    try:
        assert schedule_id == retention_schedule_id(stack.task_queue)
        await schedule.pause(note="an operator's pause")

        # A worker starting again, configured with another interval.
        await ensure_retention_schedule(
            stack.client, stack.task_queue, operations, timedelta(hours=2)
        )
        described = await schedule.describe()
        action = described.schedule.action
        assert isinstance(action, ScheduleActionStartWorkflow)
        assert action.workflow == RETENTION_WORKFLOW_TYPE
        assert [spec.every for spec in described.schedule.spec.intervals] == [timedelta(hours=2)]
        assert described.schedule.state.paused

        await schedule.trigger()

        async def pruned() -> bool:
            record = store.get_item(stack.engine, old)
            return record is not None and record.payload_pruned_at is not None

        await wait_for(pruned, limit_s=30)
        [run] = (await schedule.describe()).info.recent_actions
        assert isinstance(run.action, ScheduleActionExecutionStartWorkflow)
        await stack.record_history(run.action.workflow_id)
    finally:
        await schedule.delete()
