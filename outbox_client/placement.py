"""Where an item lives: the one workflow that holds it, by its destination's mode and its key.

| mode | ordering key | held by |
|---|---|---|
| item | none | its own item workflow, `outbox/{outbox}/{key}` |
| item | set | its lane's workflow, `lane/{outbox}/{ordering_key}` |
| bulk | none | the destination's shard that owns the item id |
| bulk | set | the destination's shard that owns the lane id (every item of the key) |

Every host but the item workflow is a `workflows.host.DeliveryHostWorkflow` and answers the
same signals for the items it holds (`cancel_item`, `item_delivery_report`), so a verb needs
the holder's id and whether it is an item workflow, nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.destinations import Destination
from contract.bulk import owner_id, shard_of, shard_workflow_id
from contract.ids import item_workflow_id, lane_workflow_id


@dataclass(frozen=True)
class Holder:
    """The workflow that holds an item (or a lane), and whether it is the item's own."""

    workflow_id: str
    own: bool


def item_holder(
    outbox: str, key: str, ordering_key: str | None, destination: Destination | None
) -> Holder:
    """The workflow that holds the item (a destination no longer configured: item mode)."""
    if destination is not None and destination.mode == "bulk":
        shard = shard_of(owner_id(outbox, key, ordering_key), destination.shards)
        return Holder(shard_workflow_id(destination.name, shard), own=False)
    if ordering_key is not None:
        return Holder(lane_workflow_id(outbox, ordering_key), own=False)
    return Holder(item_workflow_id(outbox, key), own=True)


def lane_holder(outbox: str, ordering_key: str, destination: Destination | None) -> str:
    """The workflow that holds a lane: its own (item mode), or its bulk destination's shard."""
    lane_id = lane_workflow_id(outbox, ordering_key)
    if destination is not None and destination.mode == "bulk":
        return shard_workflow_id(destination.name, shard_of(lane_id, destination.shards))
    return lane_id
