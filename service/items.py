"""Item use cases: enqueue (one or many), read (live or projected), history, cancel, redrive."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, TypeVar

from sqlalchemy import Engine

from contract import transitions
from contract.ids import item_workflow_id, payload_hash
from contract.item import DeliveryOutcome, ItemStatus, OutboxItemInput, OutboxItemView
from contract.lane import entry_size
from outbox_client import (
    CancelRequested,
    CannotCancel,
    EnqueueResult,
    ItemNotFound,
    NotRedrivable,
    OutboxClient,
    OutboxError,
    is_temporal_unavailable,
    validate_key,
    validate_outbox,
)
from outbox_client.client import CANCEL_WAIT, check_same_request, failed_use_redrive
from outbox_client.lanes import check_capacity
from readmodel import lanes as lane_store
from readmodel import store
from readmodel.models import EventRecord, ItemRecord
from readmodel.writer import ProjectionWriter
from service.fan_out import fan_out

log = logging.getLogger("outbox.service")

# Only a failed item can run again (redrive), so only a failed row can be behind its workflow.
_SETTLED = frozenset({ItemStatus.SENT, ItemStatus.CANCELLED})

T = TypeVar("T")


@dataclass
class NewItem:
    """One item to enqueue, as a caller describes it."""

    destination: str
    payload: dict[str, Any]
    key: str
    ordering_key: str | None = None
    not_before: datetime | None = None
    max_attempts: int | None = None


@dataclass
class Enqueued:
    """An enqueue's outcome: the item, whether this call created it, and its current status."""

    result: EnqueueResult
    status: ItemStatus


@dataclass
class ItemSnapshot:
    """An item's view, its payload when known, and where the view came from."""

    view: OutboxItemView
    payload: dict[str, Any] | None
    source: Literal["workflow", "read-model"]


@dataclass
class Purge:
    """Keys of the items a purge cancelled, and how many it found already handed over."""

    cancelled: list[str]
    skipped: int


@dataclass
class RedriveSweep:
    """Keys of the failed items started again, and how many could not be (raced or changed)."""

    redriven: list[str]
    skipped: int


class ItemService:
    """The item use cases over one `OutboxClient` and one read-model engine."""

    def __init__(
        self, client: OutboxClient, engine: Engine, *, cancel_wait: timedelta = CANCEL_WAIT
    ) -> None:
        self.client = client
        self.engine = engine
        # The `queued` rows of the items this service starts, group-committed.
        self.writer = ProjectionWriter(engine)
        # How long a cancel waits for a worker before it is recorded as a signal instead.
        self.cancel_wait = cancel_wait

    async def enqueue(self, outbox: str, item: NewItem) -> Enqueued:
        """Start the item, or find the key's existing item and its current status.

        The read model answers for a key whose item has settled: it remembers the item after
        Temporal's retention has deleted the workflow, when a new start would deliver it again.
        """
        remembered = await self._remembered(outbox, item)
        if remembered is not None:
            return remembered
        return await self._start_enqueue(outbox, item)

    async def _record_queued(self, item_id: str, item: OutboxItemInput) -> None:
        await self.writer.write(transitions.enqueued(item_id, item))

    async def _remembered(self, outbox: str, item: NewItem) -> Enqueued | None:
        """The item the read model holds for the key, where it can answer (None: ask Temporal).

        A settled item (Temporal may have forgotten it), and an item of an ordering lane (it may
        be waiting in its lane, with no workflow to ask yet). A lane's read-model row also
        stands in for its capacity check when the lane cannot answer queries quickly enough.
        """
        item_id = item_workflow_id(outbox, item.key)
        record = await self._record(outbox, item.key)
        if record is None:
            await self._check_lane_capacity(outbox, item)
            return None
        status = record.view.status
        # A bulk-mode item has no workflow of its own to ask: its row answers while it runs too.
        if not status.is_final and record.view.ordering_key is None and not self._bulk(record):
            return None
        if status is ItemStatus.FAILED:
            # A failed item may be running again (redriven): only its workflow knows.
            try:
                await self.client.status(outbox, item.key)
            except ItemNotFound:
                pass
            else:
                return None
        check_same_request(
            record.view.payload_hash,
            payload_hash(item.destination, item.payload, item.ordering_key),
        )
        if status is ItemStatus.FAILED:
            raise failed_use_redrive()
        result = EnqueueResult(item_id=item_id, outbox=outbox, key=item.key, created=False)
        return Enqueued(result, status)

    def _bulk(self, record: ItemRecord) -> bool:
        destination = self.client.destinations.get(record.view.destination)
        return destination is not None and destination.mode == "bulk"

    async def _check_lane_capacity(self, outbox: str, item: NewItem) -> None:
        if item.ordering_key is None:
            return
        lane = await asyncio.to_thread(lane_store.get_lane, self.engine, outbox, item.ordering_key)
        if lane is not None:
            check_capacity(lane, entry_size(item.key, item.payload))

    async def _record(self, outbox: str, key: str) -> ItemRecord | None:
        """The item's read-model record (None if never projected), once its address is valid."""
        validate_outbox(outbox)
        validate_key(key)
        return await asyncio.to_thread(store.get_item, self.engine, item_workflow_id(outbox, key))

    async def enqueue_many(
        self, outbox: str, items: Sequence[NewItem]
    ) -> list[Enqueued | Exception]:
        """Enqueue each item on its own (a few at a time); one failure fails only its item.

        Items of bulk-mode destinations go to their shards together: one signal per shard for
        the whole batch, which is what makes a batch cheap in bulk mode. Items with an ordering
        key keep the batch's order within their lane."""
        validate_outbox(outbox)
        outcomes: list[Enqueued | Exception | None] = [None] * len(items)
        by_destination: dict[str, list[tuple[int, OutboxItemInput]]] = {}
        singly: list[int] = []
        laned: list[int] = []
        for index, item in enumerate(items):
            target = self.client.destinations.get(item.destination)
            if target is None or target.mode != "bulk":
                (laned if item.ordering_key is not None else singly).append(index)
                continue
            try:
                remembered = await self._remembered(outbox, item)
                if remembered is not None:
                    outcomes[index] = remembered
                    continue
                built = self._new_input(outbox, item)
            except Exception as err:
                outcomes[index] = err
                continue
            by_destination.setdefault(target.name, []).append((index, built))
        single = await fan_out([functools.partial(self.enqueue, outbox, items[i]) for i in singly])
        for index, outcome in zip(singly, single, strict=True):
            outcomes[index] = outcome
        await self._enqueue_in_order(outbox, items, laned, outcomes)
        for name, held in by_destination.items():
            target = self.client.destinations.get(name)
            assert target is not None
            shards = target.shards
            try:
                await self.client.hand_to_shards([built for _, built in held], shards)
            except Exception as err:
                for index, _ in held:
                    outcomes[index] = err
                continue
            for index, built in held:
                item_id = item_workflow_id(outbox, built.key)
                await self._queued_row(item_id, built)
                result = EnqueueResult(item_id=item_id, outbox=outbox, key=built.key, created=True)
                outcomes[index] = Enqueued(result, ItemStatus.QUEUED)
        return [outcome for outcome in outcomes if outcome is not None]

    async def _enqueue_in_order(
        self,
        outbox: str,
        items: Sequence[NewItem],
        indexes: list[int],
        outcomes: list[Enqueued | Exception | None],
    ) -> None:
        """Enqueue item-mode items with ordering keys so that each lane gets them in the
        batch's order: the read model is asked about all of them first, then the appends start
        in order (each lane's mailbox queues them as they come, and sends them together)."""
        pending: list[int] = []
        for index in indexes:
            try:
                remembered = await self._remembered(outbox, items[index])
            except Exception as err:
                outcomes[index] = err
                continue
            if remembered is not None:
                outcomes[index] = remembered
            else:
                pending.append(index)
        appended = await asyncio.gather(
            *(self._start_enqueue(outbox, items[index]) for index in pending),
            return_exceptions=True,
        )
        for index, outcome in zip(pending, appended, strict=True):
            outcomes[index] = outcome if isinstance(outcome, (Enqueued, Exception)) else None

    async def _start_enqueue(self, outbox: str, item: NewItem) -> Enqueued:
        """Hand the item over (the read model found nothing for its key)."""
        result = await self.client.enqueue(
            outbox,
            item.destination,
            item.payload,
            key=item.key,
            ordering_key=item.ordering_key,
            not_before=item.not_before,
            max_attempts=item.max_attempts,
            record_queued=self._record_queued,
        )
        if result.created:
            return Enqueued(result, ItemStatus.QUEUED)
        try:
            # Live or projected: an item of a lane has no workflow of its own to ask.
            snapshot = await self.get(outbox, item.key)
        except ItemNotFound:
            # In its lane, and not yet projected: it is queued.
            return Enqueued(result, ItemStatus.QUEUED)
        return Enqueued(result, snapshot.view.status)

    def _new_input(self, outbox: str, item: NewItem) -> OutboxItemInput:
        built = self.client.new_item(
            outbox,
            item.destination,
            item.payload,
            key=item.key,
            ordering_key=item.ordering_key,
            not_before=item.not_before,
            max_attempts=item.max_attempts,
        )
        built.enqueue_projected = True
        return built

    async def _queued_row(self, item_id: str, item: OutboxItemInput) -> None:
        try:
            await self._record_queued(item_id, item)
        except Exception as err:
            # Handed over already; the first submit writes the row.
            log.warning("queued row of %s left to its first submit: %s", item_id, err)

    async def get(self, outbox: str, key: str) -> ItemSnapshot:
        """Live from the workflow while it runs; from the read model once it has ended, once
        Temporal no longer has it (retention), or while Temporal is unreachable."""
        record = await self._record(outbox, key)
        if record is not None and record.view.status in _SETTLED:
            return _projected(record)
        try:
            view = await self.client.status(outbox, key)
        except ItemNotFound:
            if record is None:
                raise
            return _projected(record)
        except Exception as err:
            if record is None or not is_temporal_unavailable(err):
                raise
            # The last projected state beats an error for a read.
            log.warning("serving %s from the read model: Temporal unavailable", record.view.id)
            return _projected(record)
        if record is not None and view.status.is_final and record.view.status is view.status:
            return _projected(record)
        return ItemSnapshot(view, record.payload if record else None, "workflow")

    async def events(self, outbox: str, key: str) -> list[EventRecord]:
        """The item's transitions oldest first (empty until the first one is projected)."""
        validate_outbox(outbox)
        validate_key(key)
        item_id = item_workflow_id(outbox, key)
        events = await asyncio.to_thread(store.item_events, self.engine, item_id)
        if not events and await asyncio.to_thread(store.get_item, self.engine, item_id) is None:
            await self.client.status(outbox, key)  # raises ItemNotFound for an unknown item
        return events

    async def list(
        self,
        outbox: str,
        *,
        status: ItemStatus | None = None,
        destination: str | None = None,
        error_code: str | None = None,
        delivery: DeliveryOutcome | None = None,
        created_from: datetime | None = None,
        created_to: datetime | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> tuple[list[ItemSnapshot], str | None]:
        """A page of the outbox's items from the read model, newest first, and the next cursor."""
        validate_outbox(outbox)
        records, next_cursor = await asyncio.to_thread(
            store.list_items,
            self.engine,
            outbox,
            status=status.value if status else None,
            destination=destination,
            error_code=error_code,
            delivery=delivery.value if delivery else None,
            created_from=created_from,
            created_to=created_to,
            cursor=cursor,
            limit=limit,
        )
        return [_projected(record) for record in records], next_cursor

    async def cancel(self, outbox: str, key: str, reason: str) -> ItemSnapshot | CancelRequested:
        """Cancel a queued item; `CannotCancel` once the provider has it; `CancelRequested`
        when no worker answered in time and the cancel waits, recorded, for one."""
        record = await self._record(outbox, key)
        if record is not None and record.view.status in _SETTLED:
            # Settled for good; an item cancelled in its lane never had a workflow to ask.
            raise CannotCancel(
                f"item is {record.view.status.value}; only queued items can be cancelled"
            )
        if record is not None and self._bulk(record):
            if record.view.status is not ItemStatus.QUEUED:
                raise CannotCancel(
                    f"item is {record.view.status.value}; only queued items can be cancelled"
                )
            return await self.client.cancel_bulk(record.view, reason)
        outcome = await self.client.cancel(
            outbox,
            key,
            reason,
            wait=self.cancel_wait,
            ordering_key=record.view.ordering_key if record is not None else None,
        )
        if isinstance(outcome, CancelRequested):
            return outcome
        return ItemSnapshot(outcome, None, "workflow")

    async def purge(
        self, outbox: str, destination: str | None = None, reason: str = "purged"
    ) -> Purge:
        """Cancel every item of the outbox (optionally of one destination) not yet submitted.

        An item the provider accepted meanwhile is left alone (counted as skipped); one whose
        worker does not answer is cancelled by signal when a worker returns.
        """
        # Waiting items first: a lane would otherwise start its next one while its head is
        # being cancelled.
        in_lanes = await self.client.purge_lanes(outbox, destination, reason)
        keys = await self.client.queued_keys(outbox, destination)
        # Bulk-mode items have no workflow in visibility: the read model lists them.
        bulk = await self._queued_bulk_items(outbox, destination)
        cancels: list[Callable[[], Awaitable[object]]] = [
            functools.partial(self.client.cancel, outbox, key, reason) for key in keys
        ]
        cancels += [functools.partial(self.client.cancel_bulk, view, reason) for view in bulk]
        outcomes = await fan_out(cancels)
        keys = keys + [view.key for view in bulk]
        cancelled = list(in_lanes)
        for key, outcome in zip(keys, outcomes, strict=True):
            if isinstance(outcome, (CannotCancel, ItemNotFound)):
                continue  # handed to the provider, or ended, since the listing
            if isinstance(outcome, Exception):
                raise outcome
            cancelled.append(key)
        return Purge(cancelled=cancelled, skipped=len(keys) + len(in_lanes) - len(cancelled))

    async def _queued_bulk_items(
        self, outbox: str, destination: str | None
    ) -> Sequence[OutboxItemView]:
        names = [
            d.name
            for d in self.client.destinations
            if d.mode == "bulk" and destination in (None, d.name)
        ]
        found: list[OutboxItemView] = []
        for name in names:
            cursor = None
            while True:
                records, cursor = await asyncio.to_thread(
                    store.list_items,
                    self.engine,
                    outbox,
                    status=ItemStatus.QUEUED.value,
                    destination=name,
                    cursor=cursor,
                    limit=500,
                )
                found += [record.view for record in records]
                if cursor is None:
                    break
        return found

    async def redrive(self, outbox: str, key: str) -> EnqueueResult:
        """Run a failed item again under its own id, with the destination's current policy; its
        events continue after the newest one the read model holds."""
        record = await self._record(outbox, key)
        ordering_key = record.view.ordering_key if record is not None else None
        if record is not None and ordering_key is not None:
            destination = record.view.destination if self._bulk(record) else None
            lane = await self.client.lane(outbox, ordering_key, destination)
            if lane is not None and lane.view.head_key == key and lane.view.halted_reason:
                # The head of a halted lane: the lane runs it again, then the items behind it.
                await self.client.resume_lane(
                    outbox,
                    ordering_key,
                    last_event_seq=record.view.last_event_seq,
                    head_destination=record.view.destination,
                    destination=destination,
                )
                return EnqueueResult(
                    item_id=item_workflow_id(outbox, key), outbox=outbox, key=key, created=True
                )
        if record is not None and (ordering_key is not None or self._bulk(record)):
            return await self._redrive_held(record)
        last_event_seq = record.view.last_event_seq if record is not None else 0
        return await self.client.redrive(outbox, key, last_event_seq=last_event_seq)

    async def _redrive_held(self, record: ItemRecord) -> EnqueueResult:
        """An item with no workflow of its own goes back to its holder (a lane's to its tail)."""
        view = record.view
        if view.status is not ItemStatus.FAILED:
            raise NotRedrivable(f"item is {view.status.value}; only failed items can be redriven")
        events = await asyncio.to_thread(store.item_events, self.engine, view.id)
        # Each generation has its own provider key: the redriven ones so far, plus this one.
        generation = 1 + sum(1 for event in events if event.type == "redriven")
        return await self.client.redrive_held(view, record.payload or {}, generation)

    async def redrive_failed(self, outbox: str, destination: str | None = None) -> RedriveSweep:
        """Redrive every failed item of the outbox (optionally of one destination)."""
        validate_outbox(outbox)
        keys = await asyncio.to_thread(store.list_failed, self.engine, outbox, destination)
        outcomes = await fan_out([functools.partial(self.redrive, outbox, key) for key in keys])
        started = []
        for key, outcome in zip(keys, outcomes, strict=True):
            if isinstance(outcome, OutboxError):
                continue  # redriven meanwhile by someone else, or no longer failed
            if isinstance(outcome, Exception):
                raise outcome
            started.append(key)
        return RedriveSweep(redriven=started, skipped=len(keys) - len(started))


def _projected(record: ItemRecord) -> ItemSnapshot:
    return ItemSnapshot(record.view, record.payload, "read-model")
