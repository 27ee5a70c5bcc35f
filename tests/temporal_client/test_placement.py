"""The client chooses an item's placement once, by its destination's mode and ordering key, and
each placement names the workflow that holds the item or its lane."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from durable_outbox_temporal import OutboxClient
from durable_outbox_temporal.connection import TemporalConnection
from durable_outbox_temporal.contract.bulk import owner_id, shard_of, shard_workflow_id
from durable_outbox_temporal.contract.ids import lane_workflow_id
from durable_outbox_temporal.contract.item import DeliveryPolicy, OutboxItemInput
from durable_outbox_temporal.destinations import Destination, DestinationRegistry
from durable_outbox_temporal.item_lanes import ItemLanes
from durable_outbox_temporal.own_workflow import OwnWorkflows
from durable_outbox_temporal.placement import HostedItems, ItemRef
from durable_outbox_temporal.shards import Shards

from tests.conftest import make_destination

WEBHOOK = {"url": "http://127.0.0.1:9/hook", "secret": "s"}


def client_with(*destinations: Destination) -> OutboxClient:
    registry = DestinationRegistry({d.name: d for d in destinations})
    # Nothing here connects: placement is decided before any call to Temporal.
    return OutboxClient(TemporalConnection(environ={}), registry)


def test_each_mode_and_key_has_one_placement() -> None:
    item = make_destination("webhook", WEBHOOK, name="item-dest")
    bulk = make_destination("webhook", WEBHOOK, name="bulk-dest", mode="bulk", shards=4)
    client = client_with(item, bulk)

    assert isinstance(client.placement("item-dest", None), OwnWorkflows)
    assert isinstance(client.placement("item-dest", "k"), ItemLanes)
    assert isinstance(client.placement("bulk-dest", None), Shards)
    assert isinstance(client.placement("bulk-dest", "k"), Shards)
    # A destination no longer configured: its items were workflows of their own or in lanes.
    assert isinstance(client.placement("gone", None), OwnWorkflows)
    assert isinstance(client.placement(None, "k"), ItemLanes)
    assert client.placement("item-dest", None).own
    assert not client.placement("item-dest", "k").own
    assert not client.placement("bulk-dest", "k").own


async def test_a_keys_items_meet_in_the_shard_that_owns_its_lane() -> None:
    bulk = make_destination("webhook", WEBHOOK, name="bulk-dest", mode="bulk", shards=8)
    client = client_with(bulk)
    shards = client.placement("bulk-dest", "k")
    assert isinstance(shards, HostedItems)

    lane_shard = shard_workflow_id("bulk-dest", shard_of(lane_workflow_id("o", "k"), 8))
    holders = {shards.holder(ItemRef("o", f"item-{n}", "bulk-dest", "k")) for n in range(20)}
    assert holders == {lane_shard}
    assert await shards.lane_holder("o", "k", "bulk-dest") == lane_shard
    # Without a key each item goes to the shard that owns its own id.
    unordered = {shards.holder(ItemRef("o", f"item-{n}", "bulk-dest")) for n in range(20)}
    assert unordered == {
        shard_workflow_id("bulk-dest", shard_of(owner_id("o", f"item-{n}", None), 8))
        for n in range(20)
    }
    assert len(unordered) > 1


def test_a_changed_registry_reaches_every_placement() -> None:
    client = client_with(make_destination("webhook", WEBHOOK, name="item-dest"))
    bulk = make_destination("webhook", WEBHOOK, name="item-dest", mode="bulk", shards=2)
    client.destinations = DestinationRegistry({bulk.name: bulk})
    assert isinstance(client.placement("item-dest", None), Shards)
    lanes = client.placement("item-dest", "k")
    assert isinstance(lanes, Shards) and lanes.destinations is client.destinations


class SharedRoutes:
    """Routes as the read model keeps them, shared by every client given them."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}

    async def claim(self, destination: str, owners: Sequence[str], shards: int) -> dict[str, int]:
        for owner in owners:
            self.counts.setdefault((destination, owner), shards)
        return {owner: self.counts[(destination, owner)] for owner in owners}

    async def find(self, destination: str, owner: str) -> int | None:
        return self.counts.get((destination, owner))


class Signalled(Shards):
    """Shards that record which shard each handed item's signal went to, sending nothing."""

    def __init__(self, *args: Any, routes: SharedRoutes | None = None) -> None:
        super().__init__(*args, routes=routes)
        self.sent: list[tuple[str, OutboxItemInput]] = []
        # The count each went by: a shard it starts records it (its memo, `shards`).
        self.counts: list[int] = []

    async def _signal_shard(self, workflow_id: str, handed: list[Any]) -> list[None]:
        self.sent += [(workflow_id, entry.item) for entry in handed]
        self.counts += [entry.count for entry in handed]
        return [None] * len(handed)


def bulk_item(key: str, ordering_key: str | None) -> OutboxItemInput:
    policy = DeliveryPolicy("bulk-dest", "outbox-submit-bulk-dest", "outbox-poll-bulk-dest")
    return OutboxItemInput("o", key, "bulk-dest", {}, "h", policy, ordering_key=ordering_key)


def senders(counts: Sequence[int], routes: SharedRoutes | None) -> list[Signalled]:
    found = []
    for count in counts:
        bulk = make_destination("webhook", WEBHOOK, name="bulk-dest", mode="bulk", shards=count)
        registry = DestinationRegistry({bulk.name: bulk})
        found.append(Signalled(TemporalConnection(environ={}).client, registry, "q", routes=routes))
    return found


def moving(owner_of: Callable[[str], str]) -> str:
    """A name whose owner another shard holds under 8 than under 4."""
    return next(
        name
        for name in (f"n{n}" for n in range(100))
        if shard_of(owner_of(name), 4) != shard_of(owner_of(name), 8)
    )


async def test_with_routes_an_owner_keeps_the_count_it_was_first_handed_over_by() -> None:
    # Two processes configured with different counts (a rolling restart that changes `shards`):
    # a lane's items and an unordered item's repeat reach one shard whichever sends them.
    routes = SharedRoutes()
    four, eight = senders([4, 8], routes)
    lane = moving(lambda name: lane_workflow_id("o", name))
    repeated = moving(lambda name: owner_id("o", name, None))
    await four.hand_over([bulk_item("a", lane), bulk_item(repeated, None)])
    await eight.hand_over([bulk_item("b", lane), bulk_item(repeated, None), bulk_item("v", None)])

    lane_shard = shard_workflow_id("bulk-dest", shard_of(lane_workflow_id("o", lane), 4))
    item_shard = shard_workflow_id("bulk-dest", shard_of(owner_id("o", repeated, None), 4))
    sent = [(workflow_id, item.key, item.shards) for workflow_id, item in four.sent + eight.sent]
    # An unordered item records the count it went by (its cancels and reports follow it; a
    # laned item's follow its lane's route); a new owner takes its sender's count.
    assert sent == [
        (lane_shard, "a", None),
        (item_shard, repeated, 4),
        (lane_shard, "b", None),
        (item_shard, repeated, 4),
        (shard_workflow_id("bulk-dest", shard_of(owner_id("o", "v", None), 8)), "v", 8),
    ]
    assert four.counts + eight.counts == [4, 4, 4, 4, 8]
    # A lane's verbs (resume, skip, its detail) and its items' cancels and reports find the
    # shard its route names, where the configured count alone would not.
    assert await eight.lane_holder("o", lane, "bulk-dest") == lane_shard
    laned = ItemRef("o", "b", "bulk-dest", lane)
    assert await eight.holder_of(laned) == lane_shard
    assert eight.holder(laned) != lane_shard


async def test_without_routes_each_sender_goes_by_its_configured_count() -> None:
    four, eight = senders([4, 8], None)
    await four.hand_over([bulk_item("a", "k")])
    await eight.hand_over([bulk_item("b", "k")])
    assert [item.shards for _, item in four.sent + eight.sent] == [None, None]
    assert [workflow_id for workflow_id, _ in four.sent + eight.sent] == [
        shard_workflow_id("bulk-dest", shard_of(lane_workflow_id("o", "k"), count))
        for count in (4, 8)
    ]
