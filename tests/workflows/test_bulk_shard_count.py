"""A bulk item goes by the shard count it was routed by: a cancel or a delivery report from a
process configured with another count (an API restarted with a new `shards` before the
destination's shards have drained) still reaches the shard that holds the item."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta

from durable_outbox_temporal import OutboxClient
from durable_outbox_temporal.contract import transitions
from durable_outbox_temporal.contract.bulk import owner_id, shard_of, shard_workflow_id
from durable_outbox_temporal.contract.ids import (
    item_workflow_id,
    lane_workflow_id,
    provider_idempotency_key,
)
from durable_outbox_temporal.contract.item import (
    DeliveryOutcome,
    DeliveryReport,
    ItemStatus,
    NewItem,
    OutboxItemInput,
    OutboxItemView,
    RecipientStatus,
)
from durable_outbox_temporal.destinations import Destination, DestinationRegistry
from durable_outbox_temporal.placement import ItemRef
from durable_outbox_temporal.shards import Routes

from readmodel import store
from readmodel.routes import ReadModelRoutes
from readmodel.writer import ProjectionWriter
from service.reports import DeliveryReportService
from tests.conftest import email_destination, unique_name, webhook_destination
from tests.fakes import submits
from tests.workflows.test_bulk import enqueue_all, sent_bulk_item, until_settled
from tests.workflows.test_outbox_item import EMAIL

ROUTED_BY = 2
WAIT = timedelta(seconds=5)
CONFIGURED_NOW = 4


def key_whose_shard_moves(prefix: str) -> str:
    """A key held by another shard under the new count than under the one it was routed by."""
    while True:
        key = unique_name(prefix)
        owner = owner_id("tests", key, None)
        if shard_of(owner, ROUTED_BY) != shard_of(owner, CONFIGURED_NOW):
            return key


def rescaled(stack, destination: Destination, routes: Routes | None = None) -> OutboxClient:
    """A client of the same destinations with the destination's `shards` changed (with the read
    model's `routes`, as a restarted API process has them)."""
    changed = destination.model_copy(update={"shards": CONFIGURED_NOW})
    return OutboxClient(
        stack.client,
        DestinationRegistry({destination.name: changed}),
        stack.task_queue,
        routes=routes,
    )


async def test_a_report_reaches_the_shard_an_item_was_routed_to_under_another_count(
    stack_factory, fake_provider
) -> None:
    destination = email_destination(
        fake_provider, mode="bulk", shards=ROUTED_BY, report_window_s=3600
    )
    stack = await stack_factory(destination)
    item = await sent_bulk_item(stack, destination.name, EMAIL, key_whose_shard_moves("rep"))
    row = store.get_item(stack.engine, item.item_id)
    assert row is not None and row.view.shards == ROUTED_BY

    reports = DeliveryReportService(rescaled(stack, destination), stack.engine)
    address = EMAIL["recipients"]["to"][0]["address"]
    bounce = DeliveryReport(
        provider_idempotency_key(item.item_id),
        address,
        RecipientStatus.BOUNCED,
        datetime(2026, 11, 30, tzinfo=UTC),
    )
    tally = await reports.receive(destination.name, [bounce])
    # Applied by the shard that holds the item (sent to a shard of the new count, it found no
    # running workflow and was counted late).
    assert (tally.applied, tally.late, tally.unknown) == (1, 0, 0)

    def bounced(view: OutboxItemView) -> bool:
        return view.delivery is DeliveryOutcome.BOUNCED

    await until_settled(stack, [item.item_id], settled=bounced, skip_time=False)


async def test_a_cancel_reaches_the_shard_an_item_was_routed_to_under_another_count(
    dev_env, stack_factory, fake_provider
) -> None:
    """On the dev server: the time-skipping server would skip the item's hour of waiting."""
    destination = email_destination(fake_provider, mode="bulk", shards=ROUTED_BY)
    stack = await stack_factory(destination, env=dev_env)
    key = key_whose_shard_moves("cancel")
    writer = ProjectionWriter(stack.engine)

    async def record_queued(item_id: str, item: OutboxItemInput) -> None:
        await writer.write(transitions.enqueued(item_id, item))

    await stack.outbox.enqueue(
        "tests",
        destination.name,
        EMAIL,
        key=key,
        not_before=datetime.now(UTC) + timedelta(hours=1),
        record_queued=record_queued,
    )
    item_id = item_workflow_id("tests", key)
    # Its `queued` row, as the API writes it.
    row = store.get_item(stack.engine, item_id)
    assert row is not None and row.view.shards == ROUTED_BY

    await rescaled(stack, destination).cancel("tests", key, "not wanted", known=row.view)

    await until_settled(
        stack,
        [item_id],
        settled=lambda view: view.status is ItemStatus.CANCELLED,
        skip_time=False,
        timeout_s=30,
    )


async def test_an_item_records_the_count_it_is_routed_by(stack_factory, fake_provider) -> None:
    """Every unordered bulk item's row and view carry the count; an item-mode item's none."""
    bulk = email_destination(fake_provider, mode="bulk", shards=3)
    stack = await stack_factory(bulk)
    [item_id] = await enqueue_all(stack, bulk, [unique_name("count")])
    # An input built without it (a redrive's, or one carried from before it was recorded): the
    # hand-over records the count it routes by.
    unrecorded = dataclasses.replace(
        stack.outbox.new_item("tests", NewItem(bulk.name, EMAIL, unique_name("count"))),
        shards=None,
    )
    await stack.outbox.hand_over([unrecorded], strict=True)
    later_id = item_workflow_id("tests", unrecorded.key)
    await ProjectionWriter(stack.engine).write(transitions.enqueued(later_id, unrecorded))
    await until_settled(stack, [item_id, later_id])
    for settled_id in (item_id, later_id):
        row = store.get_item(stack.engine, settled_id)
        assert row is not None and row.view.shards == 3
    built = stack.outbox.new_item(
        "tests", NewItem(bulk.name, EMAIL, unique_name("laned"), ordering_key="k")
    )
    assert built.shards is None  # a laned item goes by its lane's shard


def lane_key_whose_shard_moves(prefix: str) -> str:
    """An ordering key whose lane another shard owns under the new count than under the old."""
    while True:
        key = unique_name(prefix)
        owner = lane_workflow_id("tests", key)
        if shard_of(owner, ROUTED_BY) != shard_of(owner, CONFIGURED_NOW):
            return key


async def test_a_lanes_items_keep_their_shard_and_order_when_the_count_changes(
    stack_factory, fake_provider
) -> None:
    # A rolling restart that raises `shards`: a process configured with the new count hands
    # the lane its next items while the first ones still wait in the shard that holds it. Both
    # route through the read model, so every item goes to that shard, and they arrive in order.
    destination = webhook_destination(fake_provider, mode="bulk", shards=ROUTED_BY, submit_rate=50)
    stack = await stack_factory(destination)
    restarted = rescaled(stack, destination, routes=ReadModelRoutes(stack.engine))
    ordering_key = lane_key_whose_shard_moves("moving")
    keys = [unique_name(f"in-order-{n}") for n in range(6)]
    # The first item's provider is slow: the others wait behind it, in the lane.
    await fake_provider.admin.script(
        provider_idempotency_key(item_workflow_id("tests", keys[0])), [{"latency_ms": 1500}]
    )
    for n, key in enumerate(keys):
        client = stack.outbox if n < 3 else restarted
        await client.enqueue(
            "tests", destination.name, {"n": n}, key=key, ordering_key=ordering_key
        )

    # The last one is cancelled through the restarted process while it waits: its cancel goes
    # to the lane's shard by the lane's route.
    waiting = ItemRef("tests", keys[-1], destination.name, ordering_key)
    await restarted.placement(destination.name, ordering_key).cancel(waiting, "not needed", WAIT)

    item_ids = [item_workflow_id("tests", key) for key in keys]
    await until_settled(stack, item_ids)
    deliveries = await fake_provider.admin.deliveries(destination.name)
    assert [entry["payload"]["n"] for entry in deliveries] == list(range(5))
    rows = [store.get_item(stack.engine, item_id) for item_id in item_ids]
    assert [row.view.status for row in rows if row is not None] == [ItemStatus.SENT] * 5 + [
        ItemStatus.CANCELLED
    ]
    # The lane's verbs find it where its route says, from either process.
    held_by = shard_workflow_id(
        destination.name, shard_of(lane_workflow_id("tests", ordering_key), ROUTED_BY)
    )
    for client in (stack.outbox, restarted):
        place = client.placement(destination.name, ordering_key)
        assert await place.lane_holder("tests", ordering_key, destination.name) == held_by


async def test_processes_of_two_counts_keep_each_keys_order_and_send_each_item_once(
    stack_factory, fake_provider
) -> None:
    # Mid rolling restart, API processes of the old and the new count take a producer's awaited
    # enqueues in turn, and a retried request reaches both at once: each key's items still go
    # to one shard, in order, and each item to the provider once.
    destination = webhook_destination(fake_provider, mode="bulk", shards=ROUTED_BY, submit_rate=200)
    stack = await stack_factory(destination)
    restarted = rescaled(stack, destination, routes=ReadModelRoutes(stack.engine))
    clients = [stack.outbox, restarted]
    lanes = [lane_key_whose_shard_moves("rolling") for _ in range(6)]
    repeated = [key_whose_shard_moves("repeated") for _ in range(6)]

    async def producer(index: int, ordering_key: str) -> None:
        for n in range(4):
            await clients[(index + n) % 2].enqueue(
                "tests",
                destination.name,
                {"key": ordering_key, "n": n},
                key=f"{ordering_key}-{n}",
                ordering_key=ordering_key,
            )

    async def retried(key: str) -> None:
        payload = {"key": key, "n": 0}
        await asyncio.gather(
            *(client.enqueue("tests", destination.name, payload, key=key) for client in clients)
        )

    await asyncio.gather(
        *(producer(index, key) for index, key in enumerate(lanes)),
        *(retried(key) for key in repeated),
    )
    item_ids = [
        item_workflow_id("tests", key)
        for key in [f"{lane}-{n}" for lane in lanes for n in range(4)] + repeated
    ]
    await until_settled(stack, item_ids)

    for item_id in item_ids:
        assert await submits(fake_provider, item_id) == 1, item_id
    arrivals = [
        entry["payload"] for entry in await fake_provider.admin.deliveries(destination.name)
    ]
    for lane in lanes:
        assert [payload["n"] for payload in arrivals if payload["key"] == lane] == [0, 1, 2, 3]
