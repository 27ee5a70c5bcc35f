"""Ordering lanes on the time-skipping server, in item mode (a lane's own workflow) and in bulk
mode (the shard that owns the key): order per key, halt and skip, duplicates, removal,
continue-as-new. Order is judged where it matters: by arrival at the fake provider."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from durable_outbox_temporal import IdempotencyConflict
from durable_outbox_temporal.contract.bulk import owner_id, shard_of, shard_workflow_id
from durable_outbox_temporal.contract.ids import (
    item_workflow_id,
    lane_workflow_id,
    provider_idempotency_key,
)
from durable_outbox_temporal.contract.item import ItemStatus, NewItem, OutboxItemView
from durable_outbox_temporal.contract.lane import (
    APPEND_SIGNAL,
    APPEND_UPDATE,
    LANE_WORKFLOW_TYPE,
    AppendOutcome,
    LaneAppends,
    LaneAppendsResult,
    LanePolicy,
    LaneStatus,
)
from durable_outbox_temporal.destinations import Destination, DestinationRegistry, OutboxSettings
from temporalio.api.enums.v1 import EventType

from devstack.fake_provider import FakeProvider
from readmodel import store
from readmodel.lanes import get_lane
from tests.conftest import Stack, email_destination, unique_name, webhook_destination
from tests.fakes import submits
from tests.workflows.test_bulk import until_settled

pytestmark = pytest.mark.asyncio(loop_scope="session")
# `bulk-runs`: bulk mode with `submit_batch`, so a lane's items go in runs, one activity
# submitting several one after another; `item-runs`: item mode with `lane_run`, likewise, its
# requests held to the rate by the quota it needs.
MODES = ["item", "bulk", "bulk-runs", "item-runs"]


def runs_in_item_mode(lane_run: int, submit_rate: float) -> dict[str, Any]:
    """The fields of an item-mode destination whose lanes go in runs: `lane_run`, and a quota
    of the rate per second (what lets it run them)."""
    return {"lane_run": lane_run, "flow": {"quotas": [{"per": "1s", "max": int(submit_rate)}]}}


def lane_destination(fake: FakeProvider, mode: str, **overrides: Any) -> Destination:
    """A webhook destination in `mode`; in bulk mode with two shards, so lanes share them."""
    if mode == "bulk":
        overrides = {"mode": "bulk", "shards": 2, **overrides}
    if mode == "bulk-runs":
        overrides = {"mode": "bulk", "shards": 2, "submit_batch": 4, **overrides}
    if mode == "item-runs":
        rate = overrides.get("submit_rate", 100)
        overrides = {**runs_in_item_mode(overrides.pop("lane_run", 4), rate), **overrides}
    return webhook_destination(fake, **overrides)


def holder(destination: Destination, ordering_key: str, outbox: str = "tests") -> str:
    """The workflow that holds the lane: its own, or its bulk destination's shard."""
    if not destination.is_bulk:
        return lane_workflow_id(outbox, ordering_key)
    shard = shard_of(owner_id(outbox, "", ordering_key), destination.shards)
    return shard_workflow_id(destination.name, shard)


def bulk_name(destination: Destination) -> str | None:
    return destination.name if destination.is_bulk else None


def with_outbox_settings(stack: Stack, **settings: Any) -> None:
    """Give the stack's outbox `tests` its own lane settings."""
    stack.outbox.destinations = DestinationRegistry(
        {d.name: d for d in stack.destinations}, {"tests": OutboxSettings(**settings)}
    )


async def arrivals(fake: FakeProvider, destination: Destination) -> list[Any]:
    """The payloads' `n` in the order the fake received them."""
    return [entry["payload"]["n"] for entry in await fake.admin.deliveries(destination.name)]


async def wait_for(condition: Callable[[], Any], limit_s: float = 30) -> None:
    """Poll a (sync or async) condition in wall-clock time; for states no timer drives."""
    deadline = asyncio.get_running_loop().time() + limit_s
    while True:
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.05)


async def item_result(
    stack: Stack, key: str, outbox: str = "tests", *, skip_time: bool = True, limit_s: float = 60
) -> OutboxItemView:
    """The item's final view from the read model, once it has ended (an item of a lane has no
    workflow of its own). `skip_time=False` for a lane that then halts: with time unlocked, the
    time-skipping server would jump to its run timeout."""
    item_id = item_workflow_id(outbox, key)
    await until_settled(stack, [item_id], timeout_s=limit_s, skip_time=skip_time)
    record = store.get_item(stack.engine, item_id)
    assert record is not None
    return record.view


@pytest.mark.parametrize("mode", MODES)
async def test_items_of_one_key_arrive_in_enqueue_order(
    stack_factory: Any, fake_provider: FakeProvider, mode: str
) -> None:
    destination = lane_destination(fake_provider, mode, submit_rate=50)
    stack: Stack = await stack_factory(destination)
    keys = [f"order-{uuid.uuid4().hex[:8]}-{n}" for n in range(6)]
    # The first item's provider is slow: without the lane, the others would overtake it.
    await fake_provider.admin.script(
        provider_idempotency_key(item_workflow_id("tests", keys[0])), [{"latency_ms": 400}]
    )
    for n, key in enumerate(keys):
        result = await stack.enqueue(destination, {"n": n}, key=key, ordering_key="customer-1")
        assert result.created

    views = [await item_result(stack, key) for key in keys]

    assert [view.status for view in views] == [ItemStatus.SENT] * len(keys)
    assert await arrivals(fake_provider, destination) == list(range(len(keys)))
    # No workflow per item: each item's story is in the read model.
    events = store.item_events(stack.engine, item_workflow_id("tests", keys[1]))
    assert [event.type.value for event in events] == ["enqueued", "sent"]


@pytest.mark.parametrize("mode", MODES)
async def test_concurrent_appends_from_many_clients_lose_and_reorder_nothing(
    stack_factory: Any, fake_provider: FakeProvider, mode: str
) -> None:
    destination = lane_destination(fake_provider, mode, submit_rate=50)
    stack: Stack = await stack_factory(destination)
    lanes = {f"lane-{n}" for n in range(3)}
    # 3 lanes x 8 items, enqueued all at once by tasks that each wait for their own append.
    enqueues = [
        stack.enqueue(
            destination,
            {"n": f"{lane}:{n}"},
            key=f"{lane}-{n}-{uuid.uuid4().hex[:6]}",
            ordering_key=lane,
        )
        for n in range(8)
        for lane in lanes
    ]
    results = await asyncio.gather(*enqueues)
    assert all(result.created for result in results)
    await until_settled(stack, [result.item_id for result in results])
    delivered = await arrivals(fake_provider, destination)
    assert len(delivered) == 24
    for lane in lanes:
        numbers = [int(n.split(":")[1]) for n in delivered if n.startswith(f"{lane}:")]
        # Concurrent enqueues of one lane have no order between them but the lane's: every
        # item arrives once.
        assert sorted(numbers) == list(range(8))


async def test_one_clients_appends_keep_their_order_in_one_update(
    stack_factory: Any, fake_provider: FakeProvider
) -> None:
    """Appends made together from one process go as batches (one update in flight per lane),
    in the order they were made, and no query is asked."""
    destination = lane_destination(fake_provider, "item", submit_rate=200)
    stack: Stack = await stack_factory(destination)
    ordering_key = unique_name("batched")
    keys = [unique_name(f"b-{n}") for n in range(40)]
    results = await asyncio.gather(
        *(
            stack.enqueue(destination, {"n": n}, key=key, ordering_key=ordering_key)
            for n, key in enumerate(keys)
        )
    )
    assert all(result.created for result in results)
    await until_settled(stack, [result.item_id for result in results])
    assert await arrivals(fake_provider, destination) == list(range(40))
    handle = stack.client.get_workflow_handle(lane_workflow_id("tests", ordering_key))
    updates = [
        event
        async for event in handle.fetch_history_events()
        if event.HasField("workflow_execution_update_accepted_event_attributes")
    ]
    assert 1 <= len(updates) < 40


@pytest.mark.parametrize("mode", MODES)
async def test_a_repeated_key_is_one_item_and_a_changed_one_is_refused(
    stack_factory: Any, fake_provider: FakeProvider, mode: str
) -> None:
    destination = lane_destination(fake_provider, mode)
    stack: Stack = await stack_factory(destination)
    dups, head, waiting = unique_name("dups"), unique_name("head"), unique_name("waiting")
    # A halted head keeps the others waiting in the lane, where the duplicate check runs.
    await fake_provider.admin.script(
        provider_idempotency_key(item_workflow_id("tests", head)), [{"status": 400}]
    )
    await stack.enqueue(destination, {"n": 0}, key=head, ordering_key=dups)
    first = await stack.enqueue(destination, {"n": 1}, key=waiting, ordering_key=dups)
    await wait_for(lambda: _lane_status(stack, destination, dups, LaneStatus.HALTED))
    lane = await stack.outbox.lane("tests", dups, bulk_name(destination))
    assert lane is not None and lane.view.length == 2 and lane.waiting == [waiting]
    if destination.is_bulk:
        return  # a bulk shard takes repeats silently; the read model answers them (service)
    again = await stack.enqueue(destination, {"n": 1}, key=waiting, ordering_key=dups)
    with pytest.raises(IdempotencyConflict):
        await stack.enqueue(destination, {"n": 2}, key=waiting, ordering_key=dups)
    assert first.created and not again.created


@pytest.mark.parametrize("mode", MODES)
async def test_halt_stops_the_lane_until_the_head_is_redriven(
    stack_factory: Any, fake_provider: FakeProvider, mode: str
) -> None:
    destination = lane_destination(fake_provider, mode, submit_rate=50)
    stack: Stack = await stack_factory(destination)
    # Keys of its own: the time-skipping server and its workflow ids outlive each test.
    run = uuid.uuid4().hex[:6]
    lane_key, keys = f"halting-{run}", [f"halt-{run}-{n}" for n in range(3)]
    failing = provider_idempotency_key(item_workflow_id("tests", keys[1]))
    await fake_provider.admin.script(failing, [{"status": 400, "body": "bad recipient"}])
    for n, key in enumerate(keys):
        await stack.enqueue(destination, {"n": n}, key=key, ordering_key=lane_key)

    # Without skipping time: the lane halts at once, then waits on nothing but its run timeout.
    await item_result(stack, keys[0], skip_time=False)
    assert (await item_result(stack, keys[1], skip_time=False)).status is ItemStatus.FAILED
    await wait_for(lambda: _lane_status(stack, destination, lane_key, LaneStatus.HALTED))
    lane = await stack.outbox.lane("tests", lane_key, bulk_name(destination))
    assert lane is not None
    assert lane.view.head_key == keys[1] and lane.view.length == 2
    assert "bad recipient" in (lane.view.halted_reason or "")
    assert await arrivals(fake_provider, destination) == [0]
    if not destination.is_bulk:
        # The Web UI finds it by its search attribute.
        description = await stack.client.get_workflow_handle(
            holder(destination, lane_key)
        ).describe()
        assert description.typed_search_attributes.get(_lane_state_key()) == "halted"

    # The redrive gets a new provider key (generation 1), which the fake accepts.
    head = await stack.outbox.resume_lane(
        "tests", lane_key, destination=bulk_name(destination), head_destination=destination.name
    )
    assert head == keys[1]
    assert (await item_result(stack, keys[2], skip_time=False)).status is ItemStatus.SENT
    assert await arrivals(fake_provider, destination) == [0, 1, 2]
    await wait_for(lambda: _projected_lane(stack, lane_key, length=0))
    row = get_lane(stack.engine, "tests", lane_key)
    assert row is not None and row.sent == 3 and row.failed == 0
    assert row.destination == bulk_name(destination)
    events = store.item_events(stack.engine, item_workflow_id("tests", keys[1]))
    assert [event.type.value for event in events][-2:] == ["redriven", "sent"] or "redriven" in [
        event.type.value for event in events
    ]
    await stack.record_history(holder(destination, lane_key), f"_{mode}")


@pytest.mark.parametrize("mode", MODES)
async def test_skip_moves_past_a_failed_item(
    stack_factory: Any, fake_provider: FakeProvider, mode: str
) -> None:
    destination = lane_destination(fake_provider, mode, submit_rate=50)
    stack: Stack = await stack_factory(destination)
    with_outbox_settings(stack, lane_policy=LanePolicy.SKIP)
    lane_key, keys = unique_name("skipping"), [unique_name(f"lskip-{n}") for n in range(3)]
    failing = provider_idempotency_key(item_workflow_id("tests", keys[1]))
    await fake_provider.admin.script(failing, [{"status": 400}])
    for n, key in enumerate(keys):
        await stack.enqueue(destination, {"n": n}, key=key, ordering_key=lane_key)

    assert (await item_result(stack, keys[2])).status is ItemStatus.SENT
    assert (await item_result(stack, keys[1])).status is ItemStatus.FAILED
    assert await arrivals(fake_provider, destination) == [0, 2]
    await wait_for(lambda: _projected_lane(stack, lane_key, length=0))
    row = get_lane(stack.engine, "tests", lane_key)
    assert row is not None and (row.sent, row.failed, row.policy) == (2, 1, LanePolicy.SKIP)
    await stack.record_history(holder(destination, lane_key), f"_{mode}")


@pytest.mark.parametrize("mode", MODES)
async def test_an_operator_skips_the_head_of_a_halted_lane(
    stack_factory: Any, fake_provider: FakeProvider, mode: str
) -> None:
    destination = lane_destination(fake_provider, mode, submit_rate=50)
    stack: Stack = await stack_factory(destination)
    lane_key, keys = unique_name("operated"), [unique_name(f"op-{n}") for n in range(2)]
    failing = provider_idempotency_key(item_workflow_id("tests", keys[0]))
    await fake_provider.admin.script(failing, [{"status": 400}])
    for n, key in enumerate(keys):
        await stack.enqueue(destination, {"n": n}, key=key, ordering_key=lane_key)
    await wait_for(lambda: _lane_status(stack, destination, lane_key, LaneStatus.HALTED))

    head = await stack.outbox.resume_lane(
        "tests", lane_key, skip_reason="bad data", destination=bulk_name(destination)
    )
    assert head == keys[0]
    assert (await item_result(stack, keys[1], skip_time=False)).status is ItemStatus.SENT
    assert await arrivals(fake_provider, destination) == [1]


@pytest.mark.parametrize("mode", MODES)
async def test_a_waiting_item_is_cancelled_in_its_lane(
    stack_factory: Any, fake_provider: FakeProvider, mode: str
) -> None:
    destination = lane_destination(fake_provider, mode, submit_rate=50)
    stack: Stack = await stack_factory(destination)
    lane_key, keys = unique_name("waiting"), [unique_name(f"wait-{n}") for n in range(3)]
    await fake_provider.admin.script(
        provider_idempotency_key(item_workflow_id("tests", keys[0])), [{"status": 400}]
    )
    for n, key in enumerate(keys):
        await stack.enqueue(destination, {"n": n}, key=key, ordering_key=lane_key)
    await wait_for(lambda: _lane_status(stack, destination, lane_key, LaneStatus.HALTED))

    item_id = item_workflow_id("tests", keys[1])
    if not destination.is_bulk:
        view = await stack.outbox.cancel("tests", keys[1], "not wanted", ordering_key=lane_key)
        assert not isinstance(view, Exception) and view.status is ItemStatus.CANCELLED
    else:
        record = store.get_item(stack.engine, item_id)
        assert record is not None
        await stack.outbox.cancel("tests", keys[1], "not wanted", known=record.view)
    await until_settled(stack, [item_id], skip_time=False)
    record = store.get_item(stack.engine, item_id)

    assert record is not None and record.view.status is ItemStatus.CANCELLED
    assert [e.type.value for e in store.item_events(stack.engine, record.view.id)] == [
        "enqueued",
        "cancelled",
    ]
    await stack.outbox.resume_lane(
        "tests", lane_key, skip_reason="test", destination=bulk_name(destination)
    )
    assert (await item_result(stack, keys[2], skip_time=False)).status is ItemStatus.SENT
    assert await arrivals(fake_provider, destination) == [2]
    await stack.record_history(holder(destination, lane_key), f"_{mode}")


@pytest.mark.parametrize("mode", MODES)
async def test_a_lane_continues_as_new_carrying_its_queue(
    dev_env: Any, stack_factory: Any, fake_provider: FakeProvider, mode: str
) -> None:
    # On the real dev server: the time-skipping test server leaks a time-skipping lock per
    # continue-as-new. What production runs is the real server's continue-as-new.
    destination = lane_destination(fake_provider, mode, submit_rate=100)
    stack: Stack = await stack_factory(destination, env=dev_env)
    with_outbox_settings(stack, lane_history_events=100)
    ordering_key = unique_name("long")
    # The dev server suggests continue-as-new at 40 events (tests/conftest.py `dev_env`): twelve
    # items make a lane of 50 to 65 events per run, so it continues as new two or three times
    # (measured; 8 items did so once, 30 took 7 runs and most of this test's time).
    keys = [unique_name(f"can-{n}") for n in range(12)]
    for n, key in enumerate(keys):
        await stack.enqueue(destination, {"n": n}, key=key, ordering_key=ordering_key)
    await until_settled(stack, [item_workflow_id("tests", key) for key in keys])

    assert await arrivals(fake_provider, destination) == list(range(len(keys)))
    if destination.is_bulk:
        return  # a shard continues as new when Temporal suggests it (test_bulk covers it)
    # The lane's latest run was continued from an earlier one.
    handle = stack.client.get_workflow_handle(lane_workflow_id("tests", ordering_key))
    async for event in handle.fetch_history_events():
        started = event.workflow_execution_started_event_attributes
        assert started.continued_execution_run_id
        break

    async def ran_a_task() -> bool:
        # A run recorded before its first workflow task has nothing to replay.
        return (await handle.describe()).history_length >= 4

    await wait_for(ran_a_task)
    await stack.record_history(lane_workflow_id("tests", ordering_key), "_lane")


@pytest.mark.parametrize("mode", ["item-runs", "bulk-runs"])
async def test_a_run_in_flight_when_the_lane_continues_as_new_carries_every_item(
    dev_env: Any, stack_factory: Any, fake_provider: FakeProvider, mode: str
) -> None:
    """A lane with runs and `order = "submit"` continues as new (its own workflow, or its bulk
    shard) while a run's submit is out: each item of the run goes on in the next run where it
    was. Carrying only the head's, an item behind it that the provider had accepted started
    again as new, its second submit was refused as another request under the same key, and the
    lane halted."""
    runs = (
        runs_in_item_mode(4, submit_rate=100)
        if mode == "item-runs"
        else {"mode": "bulk", "shards": 2, "submit_batch": 4}
    )
    destination = email_destination(
        fake_provider, order="submit", poll_interval_s=0.2, poll_backoff_multiplier=1, **runs
    )
    # On the real dev server, which suggests continue-as-new at 40 events (`dev_env`).
    stack: Stack = await stack_factory(destination, env=dev_env)
    ordering_key = unique_name("carried")
    keys = [unique_name(f"c{n}") for n in range(24)]
    for key in keys:
        # Each operation runs for two polls: accepted items are polled outside the lane.
        await fake_provider.admin.script(
            provider_idempotency_key(item_workflow_id("tests", key)), [{"running_polls": 2}]
        )
    for n, key in enumerate(keys):
        await stack.enqueue(destination, numbered_email(n), key=key, ordering_key=ordering_key)
    item_ids = [item_workflow_id("tests", key) for key in keys]
    await until_settled(stack, item_ids, skip_time=False)

    views = [store.get_item(stack.engine, item_id) for item_id in item_ids]
    assert [view.view.status if view else None for view in views] == [ItemStatus.SENT] * 24
    for item_id in item_ids:
        stats = await fake_provider.admin.key_stats(provider_idempotency_key(item_id))
        assert stats["deliveries"] == 1, (item_id, stats)
    handle = stack.client.get_workflow_handle(holder(destination, ordering_key))
    async for event in handle.fetch_history_events():
        assert event.workflow_execution_started_event_attributes.continued_execution_run_id
        break


@pytest.mark.parametrize("mode", MODES)
async def test_waiting_items_are_queued_in_the_read_model_before_their_turn(
    stack_factory: Any, fake_provider: FakeProvider, mode: str
) -> None:
    """The second item never gets its turn (the first halts the lane), yet its `queued` row
    is written: with the lane's next write, within `PROJECT_EVERY`."""
    destination = lane_destination(fake_provider, mode)
    stack: Stack = await stack_factory(destination)
    lane_key, keys = unique_name("rm"), [unique_name(f"rm-{n}") for n in range(2)]
    await fake_provider.admin.script(
        provider_idempotency_key(item_workflow_id("tests", keys[0])), [{"status": 400}]
    )
    for n, key in enumerate(keys):
        await stack.enqueue(destination, {"n": n}, key=key, ordering_key=lane_key)

    def queued() -> bool:
        record = store.get_item(stack.engine, item_workflow_id("tests", keys[1]))
        return record is not None and record.view.status is ItemStatus.QUEUED

    await wait_for(queued)
    record = store.get_item(stack.engine, item_workflow_id("tests", keys[1]))
    assert record is not None and record.view.ordering_key == lane_key
    assert record.payload == {"n": 1}


async def test_an_append_is_answered_before_its_queued_row_is_written(
    stack_factory: Any, fake_provider: FakeProvider
) -> None:
    """The workflow task that answers an append writes nothing to the read model: the new
    waiting item's `queued` row rides the lane's next write, within `PROJECT_EVERY`
    (docs/decisions/lane-queued-rows-later.md). Before, that write (a local activity) held the
    append's answer until it was done."""
    destination = lane_destination(fake_provider, "item")
    stack: Stack = await stack_factory(destination)
    lane_key, head, waiting = unique_name("later"), unique_name("head"), unique_name("waiting")
    await fake_provider.admin.script(
        provider_idempotency_key(item_workflow_id("tests", head)), [{"status": 400}]
    )
    await stack.enqueue(destination, {"n": 0}, key=head, ordering_key=lane_key)
    # A halted lane runs nothing more: no other workflow task can share the append's.
    await wait_for(lambda: _projected_lane_status(stack, lane_key, LaneStatus.HALTED))
    handle = stack.client.get_workflow_handle(lane_workflow_id("tests", lane_key))
    before = len([event async for event in handle.fetch_history_events()])

    await stack.enqueue(destination, {"n": 1}, key=waiting, ordering_key=lane_key)

    events = [event async for event in handle.fetch_history_events()][before:]
    answered = next(
        index
        for index, event in enumerate(events)
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED
    )
    # The commands of the answering task: from its completion to the next task's scheduling.
    completed = max(
        index
        for index, event in enumerate(events[:answered])
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    )
    commands = itertools.takewhile(
        lambda event: event.event_type != EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
        events[completed:],
    )
    assert [
        event.marker_recorded_event_attributes.marker_name
        for event in commands
        if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        and event.marker_recorded_event_attributes.marker_name != "core_patch"
    ] == []

    def queued() -> bool:
        record = store.get_item(stack.engine, item_workflow_id("tests", waiting))
        return record is not None and record.view.status is ItemStatus.QUEUED

    await wait_for(queued)
    record = store.get_item(stack.engine, item_workflow_id("tests", waiting))
    assert record is not None and record.payload == {"n": 1}
    await stack.record_history(lane_workflow_id("tests", lane_key), "_queued_rows_later")


def _projected_lane_status(stack: Stack, ordering_key: str, status: LaneStatus) -> bool:
    row = get_lane(stack.engine, "tests", ordering_key)
    return row is not None and row.status is status


def _lane_state_key() -> Any:
    from durable_outbox_temporal.contract import search_attributes

    return search_attributes.LANE_STATE


async def _lane_status(
    stack: Stack, destination: Destination, ordering_key: str, status: LaneStatus
) -> bool:
    lane = await stack.outbox.lane("tests", ordering_key, bulk_name(destination))
    return lane is not None and lane.view.status is status


def _projected_lane(stack: Stack, ordering_key: str, *, length: int) -> bool:
    row = get_lane(stack.engine, "tests", ordering_key)
    return row is not None and row.length == length


@pytest.mark.parametrize("mode", MODES)
async def test_order_holds_when_the_provider_fails_and_throttles(
    stack_factory: Any, fake_provider: FakeProvider, mode: str
) -> None:
    """Retries (with backoff, or Retry-After) hold the lane: nothing overtakes its head."""
    destination = lane_destination(fake_provider, mode, submit_rate=50, backoff_initial_s=5)
    stack: Stack = await stack_factory(destination)
    faults = {
        1: [{"status": 503}, {"status": 500}],
        2: [{"status": 429, "retry_after": "30"}],
        4: [{"hang_s": 0.3, "status": 502}],
    }
    lane_key = unique_name("faulty")
    keys = [f"faulty-{uuid.uuid4().hex[:6]}-{n}" for n in range(6)]
    for n, steps in faults.items():
        key = provider_idempotency_key(item_workflow_id("tests", keys[n]))
        await fake_provider.admin.script(key, steps)
    for n, key in enumerate(keys):
        await stack.enqueue(destination, {"n": n}, key=key, ordering_key=lane_key)

    views = [await item_result(stack, key) for key in keys]

    assert [view.status for view in views] == [ItemStatus.SENT] * 6
    assert [view.attempts for view in views] == [1, 3, 2, 1, 2, 1]
    assert await arrivals(fake_provider, destination) == list(range(6))


async def test_an_append_update_answers_each_item_and_the_signal_records_it_unconfirmed(
    stack_factory: Any, fake_provider: FakeProvider
) -> None:
    """One `append_items` update answers each of its items (a repeat in the same batch is a
    duplicate, a changed one a conflict); the unconfirmed signal, sent when no worker answered,
    adds nothing the lane holds already."""
    destination = lane_destination(fake_provider, "item")
    stack: Stack = await stack_factory(destination)
    ordering_key, key = unique_name("again"), unique_name("k")
    item = stack.outbox.new_item(
        "tests", NewItem(destination.name, {"n": 0}, key, ordering_key=ordering_key)
    )
    changed = stack.outbox.new_item(
        "tests", NewItem(destination.name, {"n": 1}, key, ordering_key=ordering_key)
    )
    # Through the client, so the lane starts with the client's start input; then by hand.
    await stack.enqueue(destination, {"n": 0}, key=unique_name("first"), ordering_key=ordering_key)
    handle = stack.client.get_workflow_handle(lane_workflow_id("tests", ordering_key))
    answer = await handle.execute_update(
        APPEND_UPDATE,
        LaneAppends(items=[item, item, changed]),
        result_type=LaneAppendsResult,
    )
    assert answer.outcomes == [
        AppendOutcome.QUEUED,
        AppendOutcome.DUPLICATE,
        AppendOutcome.CONFLICT,
    ]
    await handle.signal(APPEND_SIGNAL, LaneAppends(items=[item]))
    await until_settled(stack, [item_workflow_id("tests", key)])
    assert await arrivals(fake_provider, destination) == [0, 0]
    assert LANE_WORKFLOW_TYPE == "OutboxLane"


@pytest.mark.parametrize("mode", ["bulk-runs", "item-runs"])
async def test_a_run_of_items_goes_in_one_activity_and_stops_where_one_is_not_delivered(
    stack_factory: Any, fake_provider: FakeProvider, mode: str
) -> None:
    """In bulk mode with `submit_batch` (item mode with `lane_run`), the items waiting in a lane
    go in runs: one activity submits them one after another, each once the one before was
    delivered. A retried item becomes the head on its own; one that fails halts the lane with
    nothing behind it sent."""
    runs = {"submit_batch": 5} if mode == "bulk-runs" else {"lane_run": 5}
    destination = lane_destination(fake_provider, mode, backoff_initial_s=1, **runs)
    stack: Stack = await stack_factory(destination)
    lane_key = unique_name("runs")
    keys = [unique_name(f"run-{n}") for n in range(12)]
    faults = {3: [{"status": 503}], 7: [{"status": 429, "retry_after": "2"}], 9: [{"status": 400}]}
    for n, steps in faults.items():
        await fake_provider.admin.script(
            provider_idempotency_key(item_workflow_id("tests", keys[n])), steps
        )
    items = [
        stack.outbox.new_item(
            "tests", NewItem(destination.name, {"n": n}, key, ordering_key=lane_key)
        )
        for n, key in enumerate(keys)
    ]
    await stack.outbox.hand_over(items, strict=True)

    assert (await item_result(stack, keys[9], skip_time=False)).status is ItemStatus.FAILED
    await wait_for(lambda: _lane_status(stack, destination, lane_key, LaneStatus.HALTED))
    # Everything before the failed item arrived in order; nothing behind it was sent.
    assert await arrivals(fake_provider, destination) == list(range(9))
    views = [await item_result(stack, key, skip_time=False) for key in keys[:9]]
    assert [view.attempts for view in views] == [1, 1, 1, 2, 1, 1, 1, 2, 1]
    await stack.outbox.resume_lane(
        "tests", lane_key, skip_reason="test", destination=bulk_name(destination)
    )
    await until_settled(
        stack, [item_workflow_id("tests", key) for key in keys[10:]], skip_time=False
    )
    assert await arrivals(fake_provider, destination) == [*range(9), 10, 11]
    # Runs: fewer submit activities than items (each retry goes alone).
    assert len(await submit_activities(stack, holder(destination, lane_key))) < 12


async def submit_activities(stack: Stack, workflow_id: str) -> list[Any]:
    """The submit activities a lane's host scheduled (of its latest run): their events."""
    return [
        event.activity_task_scheduled_event_attributes
        async for event in stack.client.get_workflow_handle(workflow_id).fetch_history_events()
        if event.HasField("activity_task_scheduled_event_attributes")
        and event.activity_task_scheduled_event_attributes.activity_type.name.startswith("submit")
    ]


async def test_a_run_in_item_mode_is_held_to_the_rate_by_the_quota_request_by_request(
    stack_factory: Any, fake_provider: FakeProvider
) -> None:
    """The submit queue counts a run as one activity; the quota counts each of its requests,
    across workers: at most `max` of them reach the provider in any window of `per`."""
    destination = lane_destination(
        fake_provider,
        "item",
        submit_rate=5,
        lane_run=10,
        flow={"quotas": [{"per": "1s", "max": 2}]},
    )
    stack: Stack = await stack_factory(destination)
    lane_key = unique_name("quota")
    keys = [unique_name(f"q-{n}") for n in range(6)]
    items = [
        stack.outbox.new_item(
            "tests", NewItem(destination.name, {"n": n}, key, ordering_key=lane_key)
        )
        for n, key in enumerate(keys)
    ]
    await stack.outbox.hand_over(items, strict=True)
    await until_settled(stack, [item_workflow_id("tests", key) for key in keys], skip_time=False)

    received = await fake_provider.admin.deliveries(destination.name)
    assert [entry["payload"]["n"] for entry in received] == list(range(6))
    # Any three in a row span a whole second: never three in one window of 1 s.
    times = [entry["at"] for entry in received]
    assert all(
        later - earlier >= 0.99 for earlier, later in zip(times[:-2], times[2:], strict=True)
    ), times
    # ... although the lane sent them in fewer activities than items.
    assert len(await submit_activities(stack, holder(destination, lane_key))) < 6


def numbered_email(n: int) -> dict[str, Any]:
    """An ACS email whose subject numbers it (`n{n}`), to tell items apart at the fake."""
    return {
        "senderAddress": "noreply@example.com",
        "recipients": {"to": [{"address": "ada@example.com"}]},
        "content": {"subject": f"n{n}", "plainText": "Hi"},
    }


@pytest.mark.parametrize("mode", ["item", "bulk-runs", "item-runs"])
async def test_order_submit_goes_on_once_accepted_and_halts_only_on_a_refused_submit(
    dev_env: Any, stack_factory: Any, fake_provider: FakeProvider, mode: str
) -> None:
    """With `order = "submit"` the next item goes once the one before was accepted: a slow
    operation does not hold the lane, an operation that fails later fails its item alone, and
    a refused submit halts the lane as with `end`."""
    extra: dict[str, Any] = {
        "item": {},
        "bulk-runs": {"mode": "bulk", "shards": 2, "submit_batch": 4},
        "item-runs": runs_in_item_mode(4, submit_rate=100),
    }[mode]
    # Polls 0.3 s apart: the first item's four polls take 1.2 s, the second is accepted about
    # 0.1 s after the first (measured). On the dev server: twice, on a loaded full run, the
    # time-skipping server refused the lane's workflow task ("invalid history builder state for
    # action") and an item stayed `sending`; nothing here needs time skipped.
    destination = email_destination(
        fake_provider, order="submit", poll_interval_s=0.3, poll_backoff_multiplier=1, **extra
    )
    stack: Stack = await stack_factory(destination, env=dev_env)
    lane_key = unique_name("accepting")
    keys = [unique_name(f"acc-{n}") for n in range(4)]
    scripts = [
        [{"running_polls": 3}],
        [{"running_polls": 1, "operation_result": "Failed"}],
        [{"status": 400, "body": "bad address"}],
        [],
    ]
    for key, steps in zip(keys, scripts, strict=True):
        await fake_provider.admin.script(
            provider_idempotency_key(item_workflow_id("tests", key)), steps
        )
    for n, key in enumerate(keys):
        await stack.enqueue(destination, numbered_email(n), key=key, ordering_key=lane_key)

    assert (await item_result(stack, keys[2], skip_time=False)).status is ItemStatus.FAILED
    await wait_for(lambda: _lane_status(stack, destination, lane_key, LaneStatus.HALTED))
    first = await item_result(stack, keys[0], skip_time=False)
    second = await item_result(stack, keys[1], skip_time=False)
    assert (first.status, second.status) == (ItemStatus.SENT, ItemStatus.FAILED)
    # The second was accepted before the first's operation had finished.
    events = {
        key: {
            e.type.value: e.at
            for e in store.item_events(stack.engine, item_workflow_id("tests", key))
        }
        for key in keys[:2]
    }
    assert events[keys[1]]["accepted"] < events[keys[0]]["sent"]
    lane = await stack.outbox.lane("tests", lane_key, bulk_name(destination))
    assert lane is not None and lane.view.head_key == keys[2]
    # Nothing behind the refused item went.
    assert await submits(fake_provider, item_workflow_id("tests", keys[3])) == 0
    await stack.outbox.resume_lane(
        "tests", lane_key, skip_reason="test", destination=bulk_name(destination)
    )
    assert (await item_result(stack, keys[3], skip_time=False)).status is ItemStatus.SENT


async def test_a_lane_of_many_tiny_items_is_full_by_what_it_carries(
    stack_factory: Any, fake_provider: FakeProvider
) -> None:
    """Each waiting item carries its entry's fields besides its key and payload: a lane of tiny
    items is refused appends near LANE_MAX_WAITING_BYTES of what it carries, not only once its
    keys and payloads reach it (its next run would read tens of thousands)."""
    destination = lane_destination(fake_provider, "item")
    stack: Stack = await stack_factory(destination)
    run = uuid.uuid4().hex[:6]
    lane_key, head = f"tiny-{run}", f"tiny-{run}-head"
    failing = provider_idempotency_key(item_workflow_id("tests", head))
    await fake_provider.admin.script(failing, [{"status": 400, "body": "bad recipient"}])
    await stack.enqueue(destination, {"n": 0}, key=head, ordering_key=lane_key)
    await wait_for(lambda: _lane_status(stack, destination, lane_key, LaneStatus.HALTED))

    handle = stack.client.get_workflow_handle(lane_workflow_id("tests", lane_key))
    outcomes: list[AppendOutcome] = []
    for first in range(0, 6000, 100):
        items = [
            stack.outbox.new_item(
                "tests", NewItem(destination.name, {"n": n}, f"t{n}", ordering_key=lane_key)
            )
            for n in range(first, first + 100)
        ]
        answer = await handle.execute_update(
            APPEND_UPDATE, LaneAppends(items=items), result_type=LaneAppendsResult
        )
        outcomes += answer.outcomes

    queued = outcomes.count(AppendOutcome.QUEUED)
    # About 1,000,000 / (LANE_ENTRY_BYTES + 13): its keys and payloads are 13 bytes an item.
    assert 3500 < queued < 4500, queued
    assert outcomes[queued:] == [AppendOutcome.FULL] * (len(outcomes) - queued)
