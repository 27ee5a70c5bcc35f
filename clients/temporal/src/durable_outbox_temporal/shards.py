"""Bulk mode: a destination's items held by its shards, ordered or not, no workflow per item.

An item goes to the shard that owns its id, or, with an ordering key, the shard that owns the
key's lane (a hash of `lane/{outbox}/{ordering_key}`), so every item of a key meets in one
shard, in order.

Which count the hash is taken over is the owner's route where the sender has the routes
(`Routes`, the read model's `bulk_routes`): the count the owner's first hand-over was made by,
so a change of `shards` moves only owners first seen after it (docs/decisions/shard-routes.md).
A sender without them routes by its configured count.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from temporalio.client import Client

from durable_outbox_temporal import lanes
from durable_outbox_temporal.contract.bulk import (
    ENQUEUE_SIGNAL,
    MAX_BATCH,
    SHARD_WORKFLOW_TYPE,
    SHARDS_MEMO,
    ShardEnqueue,
    ShardInput,
    admit_per_task,
    owner_id,
    shard_of,
    shard_workflow_id,
)
from durable_outbox_temporal.contract.ids import lane_workflow_id
from durable_outbox_temporal.contract.item import OutboxItemInput, OutboxItemView
from durable_outbox_temporal.destinations import Destination
from durable_outbox_temporal.errors import CannotCancel, UnknownDestination
from durable_outbox_temporal.mailbox import Mailbox
from durable_outbox_temporal.placement import (
    RPC_TIMEOUT,
    CancelRequested,
    HostedItems,
    ItemRef,
    outcomes_of,
    refuse_unless_queued,
)

# A batch's items as JSON, at most: well under Temporal's 2 MB payload limit.
MAX_SIGNAL_BYTES = 512 * 1024


class Routes(Protocol):
    """Each bulk owner's shard count, shared by every process that hands items over
    (`readmodel.routes.ReadModelRoutes`)."""

    async def claim(
        self, destination: str, owners: Sequence[str], shards: int
    ) -> Mapping[str, int]:
        """Each owner's count: its route's, or `shards` for an owner first handed over now
        (recorded as its route)."""

    async def find(self, destination: str, owner: str) -> int | None:
        """The owner's count, None without a route."""


@dataclass(frozen=True)
class _Handed:
    """An item on its way to its shard (every item in one mailbox goes to one shard)."""

    shard: int
    item: OutboxItemInput
    # The shard count it was routed by (its owner's route's, or the configured one).
    count: int


class Shards(HostedItems):
    """Items of bulk-mode destinations, held by the destination's shards.

    Concurrent hand-overs share signals: each shard gets one signal-with-start at a time from
    this process, carrying every item handed to it meanwhile in the order they came (up to
    `MAX_BATCH` items or `MAX_SIGNAL_BYTES`), so a busy lane's thousands of enqueues reach its
    shard as a few dozen signals, not thousands its workflow tasks must take in."""

    def __init__(self, *args: Any, routes: Routes | None = None) -> None:
        super().__init__(*args)
        self.routes = routes
        self._signals: Mailbox[_Handed, None] = Mailbox(
            self._signal_shard,
            max_batch=MAX_BATCH,
            size=lambda handed: len(json.dumps(handed.item.payload, default=str)),
            max_size=MAX_SIGNAL_BYTES,
        )

    def _bulk(self, name: str | None) -> Destination:
        target = self.destinations.bulk(name)
        if target is None:
            raise UnknownDestination(f"{name!r} is not a configured bulk-mode destination")
        return target

    def _shard(self, item: OutboxItemInput | ItemRef) -> int:
        """The shard that holds the item: by the count it was routed by, where known."""
        owner = owner_id(item.outbox, item.key, item.ordering_key)
        configured = self._bulk(item.destination).shards
        return shard_of(owner, item.shards or configured)

    def holder(self, item: ItemRef) -> str:
        assert item.destination is not None
        return shard_workflow_id(item.destination, self._shard(item))

    async def holder_of(self, item: ItemRef) -> str:
        """A laned item's shard is its lane's, by the lane's route where there are routes (a
        laned item records no count of its own)."""
        if item.ordering_key is None or self.routes is None:
            return self.holder(item)
        return await self.lane_holder(item.outbox, item.ordering_key, item.destination)

    async def lane_holder(self, outbox: str, ordering_key: str, destination: str | None) -> str:
        target = self._bulk(destination)
        lane_id = lane_workflow_id(outbox, ordering_key)
        routed = None if self.routes is None else await self.routes.find(target.name, lane_id)
        return shard_workflow_id(target.name, shard_of(lane_id, routed or target.shards))

    async def hand_over(self, items: Sequence[OutboxItemInput]) -> list[bool | Exception]:
        """Every item is taken (True): a shard ignores one it holds or finished lately, and
        repeats of older items are the caller's read model's to answer before this."""
        counts = await self._claimed(items)
        calls = []
        for item in items:
            owner = owner_id(item.outbox, item.key, item.ordering_key)
            # The owner's route decides where there are routes, whatever the item was given.
            count = counts.get((item.destination, owner)) or (
                item.shards or self._bulk(item.destination).shards
            )
            if item.ordering_key is None and item.shards != count:
                # Recorded with the item, so its cancels and reports find this shard under any
                # later count (a laned item's go by its lane's route).
                item = dataclasses.replace(item, shards=count)
            shard = shard_of(owner, count)
            calls.append(
                self._signals.call(
                    shard_workflow_id(item.destination, shard), _Handed(shard, item, count)
                )
            )
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        return outcomes_of(outcomes)

    async def _claimed(self, items: Sequence[OutboxItemInput]) -> dict[tuple[str, str], int]:
        """Each (destination, owner)'s count by its route, claimed before any item goes (one
        statement a destination); empty without routes."""
        if self.routes is None:
            return {}
        owners: dict[str, list[str]] = {}
        for item in items:
            owners.setdefault(item.destination, []).append(
                owner_id(item.outbox, item.key, item.ordering_key)
            )
        counts: dict[tuple[str, str], int] = {}
        for destination, named in owners.items():
            claimed = await self.routes.claim(destination, named, self._bulk(destination).shards)
            counts.update(((destination, owner), count) for owner, count in claimed.items())
        return counts

    async def _signal_shard(self, workflow_id: str, handed: list[_Handed]) -> list[None]:
        """One signal-with-start carrying a mailbox's batch of items to their shard."""
        held = [entry.item for entry in handed]
        destination, shard = held[0].destination, handed[0].shard
        target = self._bulk(destination)
        await lanes.signal_with_start(
            await self._temporal(),
            SHARD_WORKFLOW_TYPE,
            ShardInput(
                destination=destination,
                shard=shard,
                poll_batch=target.poll_batch,
                submit_batch=target.submit_batch,
                admit_per_task=admit_per_task(),
            ),
            id=workflow_id,
            # The count this start's items were routed by (their route's, where it differs).
            memo={SHARDS_MEMO: handed[0].count},
            task_queue=self._task_queue,
            start_signal=ENQUEUE_SIGNAL,
            start_signal_args=[
                ShardEnqueue(
                    items=held,
                    poll_batch=target.poll_batch,
                    submit_batch=target.submit_batch,
                    lane_policies={
                        item.outbox: self.destinations.outbox(item.outbox).lane_policy
                        for item in held
                        if item.ordering_key is not None
                    },
                )
            ],
            static_summary=f"Bulk shard {shard} of {destination}",
            rpc_timeout=RPC_TIMEOUT,
        )
        return [None] * len(handed)

    async def cancel(
        self, item: ItemRef, reason: str, wait: timedelta
    ) -> OutboxItemView | CancelRequested:
        """The shard cancels the item if it is still queued when the signal arrives (the read
        model then shows `cancelled`); no worker needs to answer first, so `wait` is unused."""
        refuse_unless_queued(item.known)
        requested = await self.signal_cancel(item, reason)
        if requested is None:
            status = item.known.status.value if item.known is not None else "unknown"
            raise CannotCancel(f"item is {status}; its shard has ended")
        return requested


async def running_shards(client: Client, destination: str) -> dict[int, int | None]:
    """The destination's running shards by number, each with the count it was started under
    (its memo; None for a shard started before the count was recorded)."""
    running: dict[int, int | None] = {}
    query = (
        f"WorkflowType = '{SHARD_WORKFLOW_TYPE}' AND ExecutionStatus = 'Running'"
        f" AND WorkflowId STARTS_WITH '{shard_workflow_id(destination, 0)[:-1]}'"
    )
    async for execution in client.list_workflows(query):
        shard = execution.id.rsplit("/", 1)[-1]
        if shard.isdigit():
            running[int(shard)] = await execution.memo_value(SHARDS_MEMO, default=None)
    return running


def count_changed(destination: Destination, running: Mapping[int, int | None]) -> bool:
    """Whether some running shard was started under another count than the configured one, or
    is numbered past it."""
    started_under = {count for count in running.values() if count is not None}
    return bool(
        started_under - {destination.shards}
        or any(shard >= destination.shards for shard in running)
    )


# A destination's owners held with no count recorded (lanes without a route, unordered items
# from before items recorded theirs): how many, and the first few's ids.
# Asked with the destination's name and its sent items' report window.
Unrouted = Callable[[str, float], Awaitable[tuple[int, list[str]]]]


async def shard_count_conflicts(
    client: Client, destinations: Iterable[Destination], unrouted: Unrouted | None = None
) -> list[str]:
    """Why each bulk destination's configured `shards` cannot serve the shards running now, if
    it cannot. A count other than the one a running shard was started under (or a shard
    numbered past it) is safe where every owner those shards hold has its route (`Routes`):
    each keeps the count it was first handed over by. `unrouted` says which held owners have
    none (the read model's `readmodel.routes.unrouted_owners`): a lane's new items would be
    routed by the new count, away from its waiting ones, and an unordered item's cancels and
    reports to a shard that does not hold it. Without `unrouted` (a process
    with no read model) any other count is a conflict: its items, a lane's items and its
    redrives and skips go by the configured count. A shard started before its count was
    recorded is caught only when its number is past the configured count."""
    found = []
    for destination in destinations:
        if not destination.is_bulk:
            continue
        running = await running_shards(client, destination.name)
        if not count_changed(destination, running):
            continue
        started_under = {count for count in running.values() if count is not None}
        counts = ", ".join(str(count) for count in sorted(started_under)) or "another count"
        changed = (
            f"destination {destination.name!r}: shards = {destination.shards} configured,"
            f" but its shards running now were started under shards = {counts}"
            f" (running: {', '.join(str(shard) for shard in sorted(running))})"
        )
        if unrouted is None:
            found.append(
                f"{changed}; set it back until they have drained and ended (nothing queued or"
                " sending, and the report window past), or its items would be routed to shards"
                " that do not hold them"
            )
            continue
        count, named = await unrouted(destination.name, destination.policy().report_window_s)
        if count:
            found.append(
                f"{changed}, and {count} of what they hold has no count recorded"
                f" ({', '.join(named)}{', ...' if count > len(named) else ''}): set it back and"
                " start a worker with the count it was handed over by (it gives held lanes their"
                " routes), or wait until it has drained, or a lane's new items would go to"
                " another shard than its waiting ones and an item's cancels to one that does not"
                " hold it"
            )
    return found
