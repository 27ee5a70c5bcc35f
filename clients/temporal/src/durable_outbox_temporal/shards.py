"""Bulk mode: a destination's items held by its shards, ordered or not, no workflow per item.

An item goes to the shard that owns its id, or, with an ordering key, the shard that owns the
key's lane (a hash of `lane/{outbox}/{ordering_key}`), so every item of a key meets in one
shard, in order.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

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


@dataclass(frozen=True)
class _Handed:
    """An item on its way to its shard (every item in one mailbox goes to one shard)."""

    shard: int
    item: OutboxItemInput


class Shards(HostedItems):
    """Items of bulk-mode destinations, held by the destination's shards.

    Concurrent hand-overs share signals: each shard gets one signal-with-start at a time from
    this process, carrying every item handed to it meanwhile in the order they came (up to
    `MAX_BATCH` items or `MAX_SIGNAL_BYTES`), so a busy lane's thousands of enqueues reach its
    shard as a few dozen signals, not thousands its workflow tasks must take in."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
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

    def lane_holder(self, outbox: str, ordering_key: str, destination: str | None) -> str:
        target = self._bulk(destination)
        lane_id = lane_workflow_id(outbox, ordering_key)
        return shard_workflow_id(target.name, shard_of(lane_id, target.shards))

    async def hand_over(self, items: Sequence[OutboxItemInput]) -> list[bool | Exception]:
        """Every item is taken (True): a shard ignores one it holds or finished lately, and
        repeats of older items are the caller's read model's to answer before this."""
        calls = []
        for item in items:
            if item.shards is None and item.ordering_key is None:
                # Recorded with the item, so its cancels and reports find this shard under any
                # later count (a laned item goes by its lane's shard).
                item = dataclasses.replace(item, shards=self._bulk(item.destination).shards)
            shard = self._shard(item)
            calls.append(
                self._signals.call(shard_workflow_id(item.destination, shard), _Handed(shard, item))
            )
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        return outcomes_of(outcomes)

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
            memo={SHARDS_MEMO: target.shards},
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


async def shard_count_conflicts(client: Client, destinations: Iterable[Destination]) -> list[str]:
    """Why each bulk destination's configured `shards` cannot serve the shards running now, if
    it cannot: new items, a lane's items and its redrives and skips are routed by the configured
    count (an unordered item's cancels and reports go by the count it recorded), so a count
    other than the one a running shard was started under sends a key's new items to another
    shard than its waiting ones, and an unordered item's hand-over repeated under the new count
    reaches a shard that cannot tell it is a repeat. A shard started before its count was
    recorded is caught only when its number is past the configured count."""
    found = []
    for destination in destinations:
        if not destination.is_bulk:
            continue
        running: dict[int, int | None] = {}
        query = (
            f"WorkflowType = '{SHARD_WORKFLOW_TYPE}' AND ExecutionStatus = 'Running'"
            f" AND WorkflowId STARTS_WITH '{shard_workflow_id(destination.name, 0)[:-1]}'"
        )
        async for execution in client.list_workflows(query):
            shard = execution.id.rsplit("/", 1)[-1]
            if shard.isdigit():
                running[int(shard)] = await execution.memo_value(SHARDS_MEMO, default=None)
        started_under = {count for count in running.values() if count is not None}
        beyond = sorted(shard for shard in running if shard >= destination.shards)
        if started_under - {destination.shards} or beyond:
            counts = ", ".join(str(count) for count in sorted(started_under)) or "another count"
            found.append(
                f"destination {destination.name!r}: shards = {destination.shards} configured,"
                f" but its shards running now were started under shards = {counts}"
                f" (running: {', '.join(str(shard) for shard in sorted(running))}); set it back"
                " until they have drained and ended (nothing queued or sending, and the report"
                " window past), or its items would be routed to shards that do not hold them"
            )
    return found
