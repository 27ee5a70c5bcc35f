"""The client chooses an item's placement once, by its destination's mode and ordering key, and
each placement names the workflow that holds the item or its lane."""

from __future__ import annotations

from durable_outbox_temporal import OutboxClient
from durable_outbox_temporal.connection import TemporalConnection
from durable_outbox_temporal.contract.bulk import owner_id, shard_of, shard_workflow_id
from durable_outbox_temporal.contract.ids import lane_workflow_id
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


def test_a_keys_items_meet_in_the_shard_that_owns_its_lane() -> None:
    bulk = make_destination("webhook", WEBHOOK, name="bulk-dest", mode="bulk", shards=8)
    client = client_with(bulk)
    shards = client.placement("bulk-dest", "k")
    assert isinstance(shards, HostedItems)

    lane_shard = shard_workflow_id("bulk-dest", shard_of(lane_workflow_id("o", "k"), 8))
    holders = {shards.holder(ItemRef("o", f"item-{n}", "bulk-dest", "k")) for n in range(20)}
    assert holders == {lane_shard}
    assert shards.lane_holder("o", "k", "bulk-dest") == lane_shard
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
