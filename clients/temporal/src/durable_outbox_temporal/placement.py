"""Where an item lives, and the verbs that reach it there: one object per delivery mode.

| mode | ordering key | held by | placement |
|---|---|---|---|
| item | none | its own workflow, `outbox/{outbox}/{key}` | `own_workflow.OwnWorkflows` |
| item | set | its lane's workflow, `lane/{outbox}/{ordering_key}` | `item_lanes.ItemLanes` |
| bulk | none | the shard that owns the item id | `shards.Shards` |
| bulk | set | the shard that owns the lane id (every item of the key) | `shards.Shards` |

`OutboxClient.placement` chooses one of them once, from the item's destination and ordering
key; every verb (hand over, cancel, redrive, report) is then written once per mode, in its
placement. Lanes and shards are both `workflows.host.DeliveryHostWorkflow`s and answer the same
signals for the items they hold, so what they share is written once here, in `HostedItems`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from durable_outbox_temporal import lanes
from durable_outbox_temporal.contract.bulk import (
    CANCEL_ITEM_SIGNAL,
    ITEM_REPORT_SIGNAL,
    ItemCancel,
    ItemReport,
)
from durable_outbox_temporal.contract.ids import item_workflow_id
from durable_outbox_temporal.contract.item import (
    CancelRequest,
    DeliveryReport,
    ItemStatus,
    OutboxItemInput,
    OutboxItemState,
    OutboxItemView,
)
from durable_outbox_temporal.destinations import Destination, DestinationRegistry
from durable_outbox_temporal.errors import CannotCancel, NotRedrivable

# Every call to Temporal gets a deadline, so a blackholed server answers the API's caller with a
# 503 instead of holding the request open. Only calls on ended workflows or quick handlers wait.
RPC_TIMEOUT = timedelta(seconds=10)


@dataclass
class CancelRequested:
    """No worker answered the cancel in time (or none needs to: a shard's item); the cancel is
    recorded as a signal and takes effect (if the item is still queued) when a worker runs it."""

    item_id: str
    outbox: str
    key: str
    reason: str


@dataclass
class EnqueueResult:
    """The item's id and whether this call created it (False: an existing item was returned)."""

    item_id: str
    outbox: str
    key: str
    created: bool


@dataclass(frozen=True)
class ItemRef:
    """An item as a verb finds it: its address, where it was sent, and what the caller's read
    model last saw of it (`known`; None for a caller without one)."""

    outbox: str
    key: str
    destination: str | None = None
    ordering_key: str | None = None
    known: OutboxItemView | None = None
    # Bulk mode: the shard count the item was routed by, where the caller knows it (its read
    # model's row); None: the count configured now.
    shards: int | None = None

    @classmethod
    def of(cls, view: OutboxItemView) -> ItemRef:
        return cls(view.outbox, view.key, view.destination, view.ordering_key, view, view.shards)

    @property
    def id(self) -> str:
        return item_workflow_id(self.outbox, self.key)


@dataclass(frozen=True)
class Redrive:
    """What a redrive hands over again: the payload (a held item keeps none of its own once it
    failed), its generation (each has its own provider key) and the newest event seq the
    caller's read model holds (the new run's events continue after it)."""

    payload: dict[str, Any]
    generation: int
    last_event_seq: int = 0


class Placement(Protocol):
    """The verbs every delivery mode answers for the items it holds."""

    # Whether each item is a workflow of its own, which answers for it live (`status`); the
    # others' story is in the read model.
    own: bool

    async def hand_over(self, items: Sequence[OutboxItemInput]) -> list[bool | Exception]:
        """Give the items (all of this placement) to their holders, in order; for each,
        whether this call created it (False: the key's item was there) or why it could not."""

    async def cancel(
        self, item: ItemRef, reason: str, wait: timedelta
    ) -> OutboxItemView | CancelRequested:
        """Cancel a queued item; `CannotCancel` once the provider may have it."""

    async def redrive(self, item: ItemRef, again: Redrive) -> EnqueueResult:
        """Run a failed item again with its destination's current policy."""

    async def report(self, item: ItemRef, report: DeliveryReport) -> bool:
        """Signal a provider's delivery report to the item's holder; False once it has ended."""


class Reach:
    """What every placement reaches Temporal with, and the configuration it reads."""

    own = False

    def __init__(
        self,
        temporal: Callable[[], Awaitable[Client]],
        destinations: DestinationRegistry,
        task_queue: str,
    ) -> None:
        self._temporal = temporal
        self.destinations = destinations
        self._task_queue = task_queue

    async def signal(self, workflow_id: str, name: str, arg: object) -> bool:
        """Signal a workflow; False if it is not running (a signal needs no worker)."""
        client = await self._temporal()
        try:
            await client.get_workflow_handle(workflow_id).signal(name, arg, rpc_timeout=RPC_TIMEOUT)
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return False
            raise
        return True


class HostedItems(Reach, ABC):
    """Items held by a delivery host (a lane's workflow, or a bulk shard): what the two hosts
    answer alike, written once. Subclasses say which workflow holds an item or a lane and how
    items reach it."""

    @abstractmethod
    def holder(self, item: ItemRef) -> str:
        """The id of the workflow that holds the item."""

    @abstractmethod
    async def lane_holder(self, outbox: str, ordering_key: str, destination: str | None) -> str:
        """The id of the workflow that holds the lane."""

    @abstractmethod
    async def hand_over(self, items: Sequence[OutboxItemInput]) -> list[bool | Exception]: ...

    @abstractmethod
    async def cancel(
        self, item: ItemRef, reason: str, wait: timedelta
    ) -> OutboxItemView | CancelRequested: ...

    async def holder_of(self, item: ItemRef) -> str:
        """The id of the workflow that holds the item, where finding it may take a lookup (a
        bulk lane's route)."""
        return self.holder(item)

    async def report(self, item: ItemRef, report: DeliveryReport) -> bool:
        return await self.signal(
            await self.holder_of(item), ITEM_REPORT_SIGNAL, ItemReport(item.id, report)
        )

    async def signal_cancel(self, item: ItemRef, reason: str) -> CancelRequested | None:
        """The holder cancels the item if it is still queued when the signal arrives (no worker
        needs to answer first); None if the holder is not running."""
        signal = ItemCancel(item.id, CancelRequest(reason=reason))
        if not await self.signal(await self.holder_of(item), CANCEL_ITEM_SIGNAL, signal):
            return None
        return CancelRequested(item_id=item.id, outbox=item.outbox, key=item.key, reason=reason)

    async def redrive(self, item: ItemRef, again: Redrive) -> EnqueueResult:
        """The head of a halted lane: the lane runs it again, then the items behind it. Any
        other failed item goes back to its holder (a lane's item to the lane's tail)."""
        done = EnqueueResult(item_id=item.id, outbox=item.outbox, key=item.key, created=True)
        if item.ordering_key is not None and await self._redrive_halted_head(item, again):
            return done
        view = item.known
        if view is None or view.status is not ItemStatus.FAILED:
            status = view.status.value if view is not None else "unknown"
            raise NotRedrivable(f"item is {status}; only failed items can be redriven")
        target = self.destination(view.destination)
        replay = OutboxItemInput(
            outbox=view.outbox,
            key=view.key,
            destination=view.destination,
            payload=again.payload,
            payload_hash=view.payload_hash or "",
            policy=target.policy(),
            ordering_key=view.ordering_key,
            enqueued_at=datetime.now(UTC),
            state=OutboxItemState(created_at=view.created_at, last_event_seq=view.last_event_seq),
            generation=again.generation,
            upsert_sending=False,
            activities_project=True,
        )
        [created] = await self.hand_over([replay])
        if isinstance(created, Exception):
            raise created
        if not created:
            raise NotRedrivable("the item is waiting in its lane already")
        return done

    async def _redrive_halted_head(self, item: ItemRef, again: Redrive) -> bool:
        assert item.ordering_key is not None
        client = await self._temporal()
        holder = await self.lane_holder(item.outbox, item.ordering_key, item.destination)
        lane = await lanes.detail(client, holder, item.outbox, item.ordering_key)
        if lane is None or lane.view.head_key != item.key or not lane.view.halted_reason:
            return False
        await self.resume(
            item.outbox,
            item.ordering_key,
            item.destination,
            head_destination=item.destination,
            last_event_seq=again.last_event_seq,
        )
        return True

    async def resume(
        self,
        outbox: str,
        ordering_key: str,
        destination: str | None,
        *,
        head_destination: str | None = None,
        last_event_seq: int = 0,
        skip_reason: str | None = None,
    ) -> str:
        """Resume a halted lane: redrive its failed head item (with `head_destination`'s current
        policy, when given), or skip it when `skip_reason` is given; the head's key."""
        target = self.destinations.get(head_destination) if head_destination else None
        policy = target.policy() if target is not None and skip_reason is None else None
        return await lanes.resume(
            await self._temporal(),
            await self.lane_holder(outbox, ordering_key, destination),
            outbox,
            ordering_key,
            redrive_policy=policy,
            last_event_seq=last_event_seq,
            skip_reason=skip_reason,
            rpc_timeout=RPC_TIMEOUT,
        )

    def destination(self, name: str) -> Destination:
        target = self.destinations.get(name)
        if target is None:
            raise NotRedrivable(f"destination {name!r} is no longer configured")
        return target


def outcomes_of(results: Sequence[object]) -> list[bool | Exception]:
    """`gather(..., return_exceptions=True)`'s results as hand-over outcomes: an item's error is
    its outcome, a bool says whether it was created, anything else (a signal sent) means taken;
    a cancellation is no item's outcome and is raised."""
    outcomes: list[bool | Exception] = []
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            raise result
        outcomes.append(result if isinstance(result, bool | Exception) else True)
    return outcomes


def refuse_unless_queued(view: OutboxItemView | None) -> None:
    """A held item's cancel is a signal nobody answers: refuse one the caller knows is past
    queued (submitting, sent, failed), as the item's own workflow would."""
    if view is not None and view.status is not ItemStatus.QUEUED:
        raise CannotCancel(f"item is {view.status.value}; only queued items can be cancelled")
