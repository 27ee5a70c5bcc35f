"""A bulk destination's `shards` changed while its shards run: taken where every owner its shards
hold keeps its count (an unordered item records it, a lane has its route in the read model),
refused while a lane holds items with no route, whose new items would go to another shard than
its waiting ones; and refused outright by a process with no read model to tell
(docs/how-to/bulk-mode.md, "A shard's life")."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import pytest
from durable_outbox_temporal.contract.bulk import (
    SHARD_WORKFLOW_TYPE,
    SHARDS_MEMO,
    ShardInput,
    shard_workflow_id,
)
from durable_outbox_temporal.contract.item import ItemProjection, ItemStatus
from durable_outbox_temporal.contract.lane import LaneStatus
from durable_outbox_temporal.destinations import DestinationRegistry
from durable_outbox_temporal.shards import shard_count_conflicts
from sqlalchemy import Engine
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities import worker_startup
from activities.worker_startup import refuse_a_changed_shard_count
from api.main import create_app
from readmodel import routes, store
from tests.api.conftest import api_settings
from tests.conftest import email_destination, unique_name
from tests.readmodel.test_routes import lane
from tests.readmodel.test_store import view
from tests.workflows.test_bulk import enqueue_all, long_lived_shard, until_settled


async def soon(found: Callable[[], Awaitable[list[str]]], timeout_s: float = 20) -> list[str]:
    """What `found()` finds once it finds something (visibility shows a run a moment later)."""
    deadline = time.monotonic() + timeout_s
    while not (result := await found()):
        assert time.monotonic() < deadline, "nothing found"
        await asyncio.sleep(0.2)
    return result


async def test_a_changed_shard_count_is_refused_while_a_shard_runs(
    dev_env, stack_factory, fake_provider
) -> None:
    # One shard (`shards = 1`) holding items, continuing as new on the way: its memo goes along.
    destination, stack, keys = await long_lived_shard(dev_env, stack_factory, fake_provider)
    item_ids = await enqueue_all(stack, destination, keys)
    handle = stack.client.get_workflow_handle(shard_workflow_id(destination.name, 0))
    deadline = time.monotonic() + 30
    while True:
        info = (await handle.describe()).raw_description.workflow_execution_info
        if info.execution.run_id != info.first_run_id:
            break  # the run checked below is one the shard continued into
        assert time.monotonic() < deadline, "the shard should have continued as new"
        await asyncio.sleep(0.1)
    wider = email_destination(fake_provider, name=destination.name, mode="bulk", shards=2)

    [message] = await soon(lambda: shard_count_conflicts(stack.client, [wider]))
    assert "shards = 2 configured" in message and "started under shards = 1" in message
    assert await shard_count_conflicts(stack.client, [destination]) == []
    # With the read model to tell: these unordered items record the count they went by (their
    # cancels and reports follow it) and no lane is held, so the change is taken.
    assert await shard_count_conflicts(stack.client, [wider], no_lanes) == []
    await refuse_a_changed_shard_count(
        stack.client, DestinationRegistry({wider.name: wider}), stack.engine
    )
    await until_settled(stack, item_ids, timeout_s=90)


async def no_lanes(destination: str, report_window_s: float) -> tuple[int, list[str]]:
    return 0, []


async def test_a_changed_count_waits_for_held_lanes_to_have_their_routes(
    dev_env, fake_provider, engine
) -> None:
    # A shard started under 1 holds a lane handed over by a release before routes (its row says
    # it holds items; no route names its count).
    one = email_destination(fake_provider, mode="bulk", shards=1)
    two = email_destination(fake_provider, name=one.name, mode="bulk", shards=2)
    lane_id = lane(engine, "k", LaneStatus.RUNNING, destination=one.name, now=datetime.now(UTC))
    # No shard shows in visibility yet: which count the lane went by is not known, so a worker
    # of either count gives it none.
    await refuse_a_changed_shard_count(dev_env.client, DestinationRegistry({two.name: two}), engine)
    assert routes.find(engine, one.name, lane_id) is None
    handle = await dev_env.client.start_workflow(
        SHARD_WORKFLOW_TYPE,
        ShardInput(destination=one.name, shard=0),
        id=shard_workflow_id(one.name, 0),
        task_queue=unique_name("no-worker"),
        memo={SHARDS_MEMO: 1},
    )
    try:
        # A worker configured with 2: the lane's next items would go by 2, away from its shard.
        with pytest.raises(
            SystemExit, match=f"1 of what they hold has no count recorded .{lane_id}"
        ):
            await soon_refused(dev_env.client, DestinationRegistry({two.name: two}), engine)
        assert routes.find(engine, one.name, lane_id) is None
        # A worker of the count the lane went by gives it its route; then 2 is taken, and the
        # lane's items keep going to the shard that holds it.
        await refuse_a_changed_shard_count(
            dev_env.client, DestinationRegistry({one.name: one}), engine
        )
        assert routes.find(engine, one.name, lane_id) == 1
        await refuse_a_changed_shard_count(
            dev_env.client, DestinationRegistry({two.name: two}), engine
        )
    finally:
        await handle.terminate("test over")


async def soon_refused(client: Client, registry: DestinationRegistry, engine: Engine) -> None:
    """`refuse_a_changed_shard_count`, once visibility shows the shard (it raises then)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        await refuse_a_changed_shard_count(client, registry, engine)
        await asyncio.sleep(0.2)


async def test_a_shard_from_before_its_count_was_recorded_is_caught_past_the_count(
    dev_env, fake_provider, engine, caplog: pytest.LogCaptureFixture
) -> None:
    # Started without the memo (by a release before it), numbered past the configured count.
    destination = email_destination(fake_provider, mode="bulk", shards=2)
    handle = await dev_env.client.start_workflow(
        SHARD_WORKFLOW_TYPE,
        ShardInput(destination=destination.name, shard=3),
        id=shard_workflow_id(destination.name, 3),
        task_queue=unique_name("no-worker"),
    )
    try:
        [message] = await soon(lambda: shard_count_conflicts(dev_env.client, [destination]))
        assert "shards = 2 configured" in message and "running: 3" in message
        # With the read model: such a shard may hold items from before items recorded their
        # count (their cancels and reports go by the configured count). One is queued: the API
        # says so at start, as the worker refuses.
        store.apply_projection(
            engine,
            ItemProjection(
                view("from-before", 1, ItemStatus.QUEUED, destination=destination.name), []
            ),
        )
        unrouted = functools.partial(routes.unrouted_owners, engine)
        [message] = await shard_count_conflicts(dev_env.client, [destination], unrouted)
        assert "outbox/o/from-before" in message
        registry = DestinationRegistry({destination.name: destination})
        app = create_app(
            api_settings(), temporal_client=dev_env.client, destinations=registry, engine=engine
        )
        with caplog.at_level(logging.ERROR, logger="outbox.api"):
            async with app.router.lifespan_context(app):
                await soon(lambda: logged(caplog, message))
    finally:
        await handle.terminate("test over")


async def logged(caplog: pytest.LogCaptureFixture, message: str) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.getMessage() == message]


async def test_a_worker_starts_when_visibility_cannot_answer(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Visibility can be down while the rest of Temporal works: the check says so and lets the
    # worker start, rather than keep every worker down with it.
    async def unavailable(*args: object) -> list[str]:
        raise RPCError("visibility unavailable", RPCStatusCode.UNAVAILABLE, b"")

    monkeypatch.setattr(worker_startup, "shard_count_conflicts", unavailable)
    with caplog.at_level(logging.WARNING, logger=worker_startup.log.name):
        await worker_startup.refuse_a_changed_shard_count(None, DestinationRegistry({}), None)  # type: ignore[arg-type]

    assert any("shard counts not checked" in record.getMessage() for record in caplog.records)
