"""Ordering lanes on the time-skipping server: order per key, halt and skip, duplicates, removal,
continue-as-new. Order is judged where it matters: by arrival at the fake provider."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError

from common.destinations import Destination, DestinationRegistry, OutboxSettings
from contract.ids import item_workflow_id, lane_workflow_id, provider_idempotency_key
from contract.item import ItemStatus
from contract.lane import (
    APPEND_OUTCOME_QUERY,
    APPEND_SIGNAL,
    LANE_WORKFLOW_TYPE,
    AppendOutcome,
    LaneAppend,
    LanePolicy,
    LaneState,
    LaneStatus,
)
from devstack.fake_provider import FakeProvider
from outbox_client import IdempotencyConflict
from outbox_client.lanes import signal_with_start
from readmodel import store
from readmodel.lanes import get_lane
from tests.conftest import Stack, unique_name, webhook_destination

pytestmark = pytest.mark.asyncio(loop_scope="session")


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
    stack: Stack, key: str, outbox: str = "tests", start_limit_s: float = 30, **wait: Any
) -> Any:
    """Wait until the lane has started the item, then for its end (`wait`: `Stack.result`'s)."""
    item_id = item_workflow_id(outbox, key)

    async def started() -> bool:
        try:
            await stack.client.get_workflow_handle(item_id).describe()
        except RPCError:
            return False
        return True

    await wait_for(started, start_limit_s)
    return await stack.result(item_id, **wait)


async def test_items_of_one_key_arrive_in_enqueue_order(
    stack_factory: Any, fake_provider: FakeProvider
) -> None:
    destination = webhook_destination(fake_provider, submit_rate=50)
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
    # Each item is its own workflow, a child of its lane.
    description = await stack.client.get_workflow_handle(
        item_workflow_id("tests", keys[1])
    ).describe()
    assert description.parent_id == lane_workflow_id("tests", "customer-1")


async def test_concurrent_appends_from_many_clients_lose_and_reorder_nothing(
    stack_factory: Any, fake_provider: FakeProvider
) -> None:
    destination = webhook_destination(fake_provider, submit_rate=50)
    stack: Stack = await stack_factory(destination)
    lanes = {f"lane-{n}" for n in range(3)}
    # 3 lanes x 8 items, enqueued all at once; each lane's order is what its history says.
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
    for result in results:
        await item_result(stack, result.key)
    delivered = await arrivals(fake_provider, destination)
    assert len(delivered) == 24
    for lane in lanes:
        numbers = [int(n.split(":")[1]) for n in delivered if n.startswith(f"{lane}:")]
        # Concurrent enqueues of one lane have no order between them but the lane's: every
        # item arrives once, and (below) in the order the lane recorded them.
        assert sorted(numbers) == list(range(8))
    history_order = {}
    for lane in lanes:
        handle = stack.client.get_workflow_handle(lane_workflow_id("tests", lane))
        appended = []
        async for event in handle.fetch_history_events():
            if event.HasField("workflow_execution_signaled_event_attributes"):
                payload = event.workflow_execution_signaled_event_attributes.input.payloads[0]
                appended.append(payload.data)
        history_order[lane] = len(appended)
        assert len(appended) == 8
        lane_arrivals = [n for n in delivered if n.startswith(f"{lane}:")]
        recorded = [
            next(n for n in lane_arrivals if f'"{n}"'.encode() in data) for data in appended
        ]
        assert lane_arrivals == recorded


async def test_a_repeated_key_is_one_item_and_a_changed_one_is_refused(
    stack_factory: Any, fake_provider: FakeProvider
) -> None:
    destination = webhook_destination(fake_provider)
    stack: Stack = await stack_factory(destination)
    # A halted head keeps the others waiting in the lane, where the duplicate check runs.
    await fake_provider.admin.script(
        provider_idempotency_key(item_workflow_id("tests", "lane-dup-head")), [{"status": 400}]
    )
    await stack.enqueue(destination, {"n": 0}, key="lane-dup-head", ordering_key="dups")
    first = await stack.enqueue(destination, {"n": 1}, key="lane-dup-1", ordering_key="dups")
    again = await stack.enqueue(destination, {"n": 1}, key="lane-dup-1", ordering_key="dups")
    with pytest.raises(IdempotencyConflict):
        await stack.enqueue(destination, {"n": 2}, key="lane-dup-1", ordering_key="dups")
    # The same key in another lane is a different request too.
    with pytest.raises(IdempotencyConflict):
        await stack.enqueue(destination, {"n": 1}, key="lane-dup-head", ordering_key="dups")

    assert first.created and not again.created
    lane = await stack.outbox.lane("tests", "dups")
    assert lane is not None and lane.view.length == 2 and lane.waiting == ["lane-dup-1"]


async def test_halt_stops_the_lane_until_the_head_is_redriven(
    stack_factory: Any, fake_provider: FakeProvider
) -> None:
    destination = webhook_destination(fake_provider, submit_rate=50)
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
    await stack.failure(item_workflow_id("tests", keys[1]), skip_time=False)
    await wait_for(lambda: _lane_status(stack, lane_key, LaneStatus.HALTED))
    lane = await stack.outbox.lane("tests", lane_key)
    assert lane is not None
    assert lane.view.head_key == keys[1] and lane.view.length == 2
    assert "bad recipient" in (lane.view.halted_reason or "")
    assert await arrivals(fake_provider, destination) == [0]
    # The Web UI finds it by its search attribute.
    description = await stack.client.get_workflow_handle(
        lane_workflow_id("tests", lane_key)
    ).describe()
    assert description.typed_search_attributes.get(_lane_state_key()) == "halted"

    # The redrive gets a new provider key (generation 1), which the fake accepts.
    assert await stack.outbox.resume_lane("tests", lane_key) == keys[1]
    await wait_for(lambda: _item_sent(stack, keys[2]))
    assert await arrivals(fake_provider, destination) == [0, 1, 2]
    await wait_for(lambda: _projected_lane(stack, lane_key, length=0))
    row = get_lane(stack.engine, "tests", lane_key)
    assert row is not None and row.sent == 3 and row.failed == 0
    await stack.record_history(lane_workflow_id("tests", lane_key), "_lane")


async def test_skip_moves_past_a_failed_item(
    stack_factory: Any, fake_provider: FakeProvider
) -> None:
    destination = webhook_destination(fake_provider, submit_rate=50)
    stack: Stack = await stack_factory(destination)
    with_outbox_settings(stack, lane_policy=LanePolicy.SKIP)
    failing = provider_idempotency_key(item_workflow_id("tests", "lskip-1"))
    await fake_provider.admin.script(failing, [{"status": 400}])
    for n in range(3):
        await stack.enqueue(destination, {"n": n}, key=f"lskip-{n}", ordering_key="skipping")

    assert (await item_result(stack, "lskip-2")).status is ItemStatus.SENT
    await stack.failure(item_workflow_id("tests", "lskip-1"))
    assert await arrivals(fake_provider, destination) == [0, 2]
    await wait_for(lambda: _projected_lane(stack, "skipping", length=0))
    row = get_lane(stack.engine, "tests", "skipping")
    assert row is not None and (row.sent, row.failed, row.policy) == (2, 1, LanePolicy.SKIP)
    await stack.record_history(lane_workflow_id("tests", "skipping"), "_lane")


async def test_an_operator_skips_the_head_of_a_halted_lane(
    stack_factory: Any, fake_provider: FakeProvider
) -> None:
    destination = webhook_destination(fake_provider, submit_rate=50)
    stack: Stack = await stack_factory(destination)
    failing = provider_idempotency_key(item_workflow_id("tests", "op-0"))
    await fake_provider.admin.script(failing, [{"status": 400}])
    for n in range(2):
        await stack.enqueue(destination, {"n": n}, key=f"op-{n}", ordering_key="operated")
    await stack.failure(item_workflow_id("tests", "op-0"), skip_time=False)
    await wait_for(lambda: _lane_status(stack, "operated", LaneStatus.HALTED))

    assert await stack.outbox.resume_lane("tests", "operated", skip_reason="bad data") == "op-0"
    assert (await item_result(stack, "op-1")).status is ItemStatus.SENT
    assert await arrivals(fake_provider, destination) == [1]


async def test_a_waiting_item_is_cancelled_in_its_lane(
    stack_factory: Any, fake_provider: FakeProvider
) -> None:
    destination = webhook_destination(fake_provider, submit_rate=50)
    stack: Stack = await stack_factory(destination)
    await fake_provider.admin.script(
        provider_idempotency_key(item_workflow_id("tests", "wait-0")), [{"status": 400}]
    )
    for n in range(3):
        await stack.enqueue(destination, {"n": n}, key=f"wait-{n}", ordering_key="waiting")
    await wait_for(lambda: _lane_status(stack, "waiting", LaneStatus.HALTED))

    view = await stack.outbox.cancel("tests", "wait-1", "not wanted", ordering_key="waiting")
    record = store.get_item(stack.engine, item_workflow_id("tests", "wait-1"))

    assert not isinstance(view, Exception) and view.status is ItemStatus.CANCELLED
    assert record is not None and record.view.status is ItemStatus.CANCELLED
    assert [e.type.value for e in store.item_events(stack.engine, record.view.id)] == [
        "enqueued",
        "cancelled",
    ]
    await stack.outbox.resume_lane("tests", "waiting", skip_reason="test")
    assert (await item_result(stack, "wait-2")).status is ItemStatus.SENT
    assert await arrivals(fake_provider, destination) == [2]
    await stack.record_history(lane_workflow_id("tests", "waiting"), "_lane")


async def test_a_lane_continues_as_new_carrying_its_queue(
    dev_env: Any, stack_factory: Any, fake_provider: FakeProvider
) -> None:
    # On the real dev server: the time-skipping test server leaks a time-skipping lock per
    # continue-as-new, and there two fresh-clone CI runs on a loaded machine saw an item of this
    # lane never start (30 s, then 120 s). What production runs is the real server's
    # continue-as-new, which is what this test is about.
    destination = webhook_destination(fake_provider, submit_rate=100)
    stack: Stack = await stack_factory(destination, env=dev_env)
    with_outbox_settings(stack, lane_history_events=100)
    ordering_key = unique_name("long")
    keys = [unique_name(f"can-{n}") for n in range(30)]
    for n, key in enumerate(keys):
        await stack.enqueue(destination, {"n": n}, key=key, ordering_key=ordering_key)
    for key in keys:
        await item_result(stack, key, start_limit_s=60)

    assert await arrivals(fake_provider, destination) == list(range(30))
    # The lane's latest run was continued from an earlier one.
    handle = stack.client.get_workflow_handle(lane_workflow_id("tests", ordering_key))
    async for event in handle.fetch_history_events():
        started = event.workflow_execution_started_event_attributes
        assert started.continued_execution_run_id
        break
    await stack.record_history(lane_workflow_id("tests", ordering_key), "_lane")


async def test_waiting_items_are_queued_in_the_read_model_at_once(
    stack_factory: Any, fake_provider: FakeProvider
) -> None:
    destination = webhook_destination(fake_provider)
    stack: Stack = await stack_factory(destination)
    await fake_provider.admin.script(
        provider_idempotency_key(item_workflow_id("tests", "rm-0")), [{"status": 400}]
    )
    await stack.enqueue(destination, {"n": 0}, key="rm-0", ordering_key="rm")
    await stack.enqueue(destination, {"n": 1}, key="rm-1", ordering_key="rm")

    record = store.get_item(stack.engine, item_workflow_id("tests", "rm-1"))
    assert record is not None
    assert record.view.status is ItemStatus.QUEUED and record.view.ordering_key == "rm"
    assert record.payload == {"n": 1}


def _lane_state_key() -> Any:
    from contract import search_attributes

    return search_attributes.LANE_STATE


async def _lane_status(stack: Stack, ordering_key: str, status: LaneStatus) -> bool:
    lane = await stack.outbox.lane("tests", ordering_key)
    return lane is not None and lane.view.status is status


async def _item_sent(stack: Stack, key: str) -> bool:
    try:
        description = await stack.client.get_workflow_handle(
            item_workflow_id("tests", key)
        ).describe()
    except RPCError:
        return False
    return description.status == WorkflowExecutionStatus.COMPLETED


def _projected_lane(stack: Stack, ordering_key: str, *, length: int) -> bool:
    row = get_lane(stack.engine, "tests", ordering_key)
    return row is not None and row.length == length


async def test_order_holds_when_the_provider_fails_and_throttles(
    stack_factory: Any, fake_provider: FakeProvider
) -> None:
    """Retries (with backoff, or Retry-After) hold the lane: nothing overtakes its head."""
    destination = webhook_destination(fake_provider, submit_rate=50, backoff_initial_s=5)
    stack: Stack = await stack_factory(destination)
    faults = {
        1: [{"status": 503}, {"status": 500}],
        2: [{"status": 429, "retry_after": "30"}],
        4: [{"hang_s": 0.3, "status": 502}],
    }
    keys = [f"faulty-{uuid.uuid4().hex[:6]}-{n}" for n in range(6)]
    for n, steps in faults.items():
        key = provider_idempotency_key(item_workflow_id("tests", keys[n]))
        await fake_provider.admin.script(key, steps)
    for n, key in enumerate(keys):
        await stack.enqueue(destination, {"n": n}, key=key, ordering_key="faulty")

    views = [await item_result(stack, key) for key in keys]

    assert [view.status for view in views] == [ItemStatus.SENT] * 6
    assert [view.attempts for view in views] == [1, 3, 2, 1, 2, 1]
    assert await arrivals(fake_provider, destination) == list(range(6))


async def test_an_append_sent_again_keeps_its_first_outcome(
    stack_factory: Any, fake_provider: FakeProvider
) -> None:
    """The client sends an append again when the lane answered `unknown`; if the lane had it
    after all, the repeat must not turn the append's own outcome into `duplicate`."""
    destination = webhook_destination(fake_provider)
    stack: Stack = await stack_factory(destination)
    ordering_key, key = unique_name("again"), unique_name("k")
    item = stack.outbox.new_item(
        "tests", destination.name, {"n": 0}, key=key, ordering_key=ordering_key
    )
    settings = stack.outbox.destinations.outbox("tests")
    lane_id = lane_workflow_id("tests", ordering_key)
    # Started here rather than through `stack.enqueue`: the teardown must still end it.
    stack.outbox.lanes.add(lane_id)
    stack.outbox.started.append(item_workflow_id("tests", key))
    state = LaneState(
        outbox="tests",
        ordering_key=ordering_key,
        policy=settings.lane_policy,
        idle_s=settings.lane_idle_s,
        continue_after_events=settings.lane_history_events,
    )

    async def send(append_id: str) -> None:
        await signal_with_start(
            stack.client,
            LANE_WORKFLOW_TYPE,
            state,
            id=lane_id,
            task_queue=stack.task_queue,
            start_signal=APPEND_SIGNAL,
            start_signal_args=[
                LaneAppend(item=item, append_id=append_id, policy=settings.lane_policy)
            ],
        )

    await send("first")
    await send("first")
    await send("another")
    handle = stack.client.get_workflow_handle(lane_id)

    async def outcome(append_id: str) -> AppendOutcome:
        answer: AppendOutcome = await handle.query(
            APPEND_OUTCOME_QUERY, append_id, result_type=AppendOutcome
        )
        return answer

    async def recorded() -> bool:
        return await outcome("first") is not AppendOutcome.PENDING

    await wait_for(recorded)
    assert await outcome("first") is AppendOutcome.QUEUED
    # A new append of the same key is what the repeat would have read as without the check.
    assert await outcome("another") is AppendOutcome.DUPLICATE
    assert (await item_result(stack, key)).status is ItemStatus.SENT
    assert await arrivals(fake_provider, destination) == [0]
