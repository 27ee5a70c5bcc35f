"""Item use cases: enqueue (one or many), read (live or projected), history, cancel, redrive."""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, TypeVar

from durable_outbox_temporal import (
    CancelRequested,
    CannotCancel,
    EnqueueResult,
    ItemNotFound,
    OutboxClient,
    OutboxError,
    is_temporal_unavailable,
    validate_key,
    validate_outbox,
)
from durable_outbox_temporal.client import (
    CANCEL_WAIT,
    RPC_TIMEOUT,
    check_same_request,
    failed_use_redrive,
)
from durable_outbox_temporal.contract import transitions
from durable_outbox_temporal.contract.dead_letters import PROGRESS_QUERY
from durable_outbox_temporal.contract.ids import item_workflow_id, payload_hash
from durable_outbox_temporal.contract.item import (
    DeliveryOutcome,
    ItemStatus,
    NewItem,
    OutboxItemInput,
    OutboxItemView,
)
from durable_outbox_temporal.contract.lane import entry_size
from durable_outbox_temporal.contract.purge import (
    PURGE_BATCH_WORKFLOW_TYPE,
    PurgeBatchInput,
    PurgeBatchProgress,
    purge_batch_workflow_id,
)
from durable_outbox_temporal.errors import ItemErased, NotRedrivable, PayloadPruned
from durable_outbox_temporal.fan_out import fan_out
from durable_outbox_temporal.lanes import check_capacity
from durable_outbox_temporal.validation import validate_purge
from sqlalchemy import Engine
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from readmodel import attempts as attempt_log
from readmodel import erasure, store
from readmodel import lanes as lane_store
from readmodel import subjects as subject_index
from readmodel.models import EventRecord, ItemRecord
from readmodel.writer import ProjectionWriter

log = logging.getLogger("outbox.service")

# Only a failed item can run again (redrive), so only a failed row can be behind its workflow.
_SETTLED = frozenset({ItemStatus.SENT, ItemStatus.CANCELLED, ItemStatus.SUPERSEDED})

T = TypeVar("T")
Progress = TypeVar("Progress")


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
    # When retention pruned its payload (the read model's word; None while kept).
    payload_pruned_at: datetime | None = None


class PurgeBatchNotFound(OutboxError):
    """No purge batch with that id exists for the outbox."""


@dataclass
class PurgeBatch:
    """A purge batch as the API shows it: its id, what it cancels and how far it is, and
    Temporal's word for the workflow (running, completed, failed, terminated...)."""

    id: str
    progress: PurgeBatchProgress
    state: str


@dataclass
class RedriveSweep:
    """Keys of the failed items started again, and how many could not be (raced or changed)."""

    redriven: list[str]
    skipped: int


class ItemPruned(OutboxError):
    """Retention deleted the item's row (Temporal has forgotten its workflow too): only its key's
    memory is left, which says how it ended."""

    def __init__(self, key: str, pruned: store.PrunedItem) -> None:
        ended = f" at {pruned.finished_at.isoformat()}" if pruned.finished_at else ""
        super().__init__(
            f"item {key!r} ended {pruned.status}{ended}; retention deleted its row at"
            f" {pruned.pruned_at.isoformat()}: its key is still remembered, and a repeat of it is"
            " never sent again"
        )
        self.pruned = pruned


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
        """Hand the item over, or find the key's existing item and its current status.

        The read model answers for a key whose item has settled: it remembers the item after
        Temporal's retention has deleted the workflow, when a new start would deliver it again.
        """
        [outcome] = await self.enqueue_many(outbox, [item])
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def _remembered(self, outbox: str, item: NewItem) -> Enqueued | None:
        """The item the read model holds for the key, where it can answer (None: ask Temporal).

        A settled item (Temporal may have forgotten it), and an item of an ordering lane (it may
        be waiting in its lane, with no workflow to ask yet). A lane's read-model row also
        stands in for its capacity check when the lane cannot answer queries quickly enough.
        """
        validate_outbox(outbox)
        validate_key(item.key)
        item_id = item_workflow_id(outbox, item.key)
        record = await asyncio.to_thread(store.item_or_remembered_key, self.engine, item_id)
        if isinstance(record, store.RememberedKey):
            # Retention deleted its row, not its key: a repeat is answered, never sent again.
            return self._answered(outbox, item, record.status, record.payload_hash)
        if record is None:
            await self._check_lane_capacity(outbox, item)
            return None
        status = record.view.status
        # An item with no workflow of its own to ask (in a lane or a shard): its row answers
        # while it runs too.
        if not status.is_final and self._own_workflow(record):
            return await self._running(outbox, item, record)
        if status is ItemStatus.FAILED:
            # A failed item may be running again (redriven): only its workflow knows.
            try:
                await self.client.status(outbox, item.key)
            except ItemNotFound:
                pass
            else:
                return None
        return self._answered(outbox, item, status, record.view.payload_hash)

    def _answered(
        self, outbox: str, item: NewItem, status: ItemStatus, known_hash: str | None
    ) -> Enqueued:
        """A repeat of an ended item's key: the same request is told its status (a failed one
        is told to redrive), another is refused. An erased item's digest went with its payload:
        any repeat is told its status, and nothing is sent again."""
        if known_hash != erasure.ERASED:
            check_same_request(
                known_hash, payload_hash(item.destination, item.payload, item.ordering_key)
            )
        if status is ItemStatus.FAILED:
            raise failed_use_redrive()
        item_id = item_workflow_id(outbox, item.key)
        result = EnqueueResult(item_id=item_id, outbox=outbox, key=item.key, created=False)
        return Enqueued(result, status)

    async def _running(self, outbox: str, item: NewItem, record: ItemRecord) -> Enqueued | None:
        """A repeat of a running item's key, answered without a second start: a start sends
        the payload, and with claim checks on stores it as a blob before Temporal refuses the
        duplicate (`readmodel/payload_store.py`). None when its workflow is gone, or its row
        knows no request to compare (ask Temporal, as a start does)."""
        if record.view.payload_hash is None:
            return None
        check_same_request(
            record.view.payload_hash,
            payload_hash(item.destination, item.payload, item.ordering_key),
        )
        try:
            live = await self.client.status(outbox, item.key)
        except ItemNotFound:
            return None
        if live.status is ItemStatus.FAILED:
            raise failed_use_redrive()
        result = EnqueueResult(item_id=live.id, outbox=outbox, key=item.key, created=False)
        return Enqueued(result, live.status)

    def _own_workflow(self, record: ItemRecord) -> bool:
        """Whether the item is a workflow of its own, which can say how it is doing live."""
        return self.client.placement(record.view.destination, record.view.ordering_key).own

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
        """Enqueue the items; one failure fails only its item.

        The read model is asked about every key first, then the new items go to the client in
        one hand-over, which gives each its placement: bulk-mode items reach their shards
        together (one signal per shard for the whole batch, which is what makes a batch cheap
        in bulk mode), and items with an ordering key keep the batch's order within their lane.
        """
        validate_outbox(outbox)
        # The read model's answers, a few at a time (each is a query in a thread).
        remembered = await fan_out([functools.partial(self._remembered, outbox, i) for i in items])
        outcomes: list[Enqueued | Exception] = []
        pending: list[tuple[int, OutboxItemInput]] = []
        for index, (item, known) in enumerate(zip(items, remembered, strict=True)):
            outcomes.append(known if known is not None else Exception("not handed over"))
            if known is None:
                try:
                    pending.append((index, self.client.new_item(outbox, item, projected=True)))
                except Exception as err:
                    outcomes[index] = err
        handed = await self.client.hand_over([built for _, built in pending])
        settled = await asyncio.gather(
            *(
                self._enqueued(built, result)
                for (_, built), result in zip(pending, handed, strict=True)
            )
        )
        for (index, _), outcome in zip(pending, settled, strict=True):
            outcomes[index] = outcome
        await self._record_subjects(outbox, items, outcomes)
        return outcomes

    async def _record_subjects(
        self, outbox: str, items: Sequence[NewItem], outcomes: list[Enqueued | Exception]
    ) -> None:
        """Attach each item enqueued (or found) for a subject to that subject's digest; an item
        whose subject could not be recorded answers with the error, and a retry of its key
        records it (an item keeps its first subject)."""
        wanted = [
            (index, item)
            for index, (item, outcome) in enumerate(zip(items, outcomes, strict=True))
            if item.subject is not None and isinstance(outcome, Enqueued)
        ]
        if not wanted:
            return
        try:
            digests = await asyncio.to_thread(
                subject_index.digests, self.engine, [item.subject or "" for _, item in wanted]
            )
            await asyncio.to_thread(
                subject_index.record,
                self.engine,
                [
                    (item_workflow_id(outbox, item.key), outbox, item.key, digest)
                    for (_, item), digest in zip(wanted, digests, strict=True)
                ],
            )
        except Exception as err:
            for index, _ in wanted:
                outcomes[index] = err

    async def _enqueued(
        self, item: OutboxItemInput, result: EnqueueResult | Exception
    ) -> Enqueued | Exception:
        """What the caller is told of a handed-over item; a new one's `queued` row is written
        first (group-committed with the batch's others)."""
        if isinstance(result, Exception):
            return result
        if result.created:
            try:
                await self.writer.write(transitions.enqueued(result.item_id, item))
            except Exception as err:
                # Handed over already; the first submit writes the row.
                log.warning("queued row of %s left to its first submit: %s", result.item_id, err)
            return Enqueued(result, ItemStatus.QUEUED)
        try:
            # Live or projected: an item of a lane has no workflow of its own to ask.
            snapshot = await self.get(item.outbox, item.key)
        except ItemNotFound:
            # In its lane, and not yet projected: it is queued.
            return Enqueued(result, ItemStatus.QUEUED)
        except Exception as err:
            return err
        return Enqueued(result, snapshot.view.status)

    async def get(self, outbox: str, key: str) -> ItemSnapshot:
        """Live from the workflow while it runs; from the read model once it has ended, once
        Temporal no longer has it (retention), or while Temporal is unreachable."""
        record = await self._record(outbox, key)
        if record is not None and (
            record.view.status in _SETTLED or not self._own_workflow(record)
        ):
            return _projected(record)
        try:
            view = await self.client.status(outbox, key)
        except ItemNotFound:
            if record is None:
                await self._raise_if_pruned(key, item_workflow_id(outbox, key))
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
            try:
                await self.client.status(outbox, key)
            except ItemNotFound:
                await self._raise_if_pruned(key, item_id)
                raise
        return events

    async def _raise_if_pruned(self, key: str, item_id: str) -> None:
        """`ItemPruned` for an item whose row retention deleted (its key memory says how it
        ended), rather than the "not found" that reads as "never sent"."""
        pruned = await asyncio.to_thread(store.pruned_item, self.engine, item_id)
        if pruned is not None:
            raise ItemPruned(key, pruned) from None

    async def list(
        self,
        outbox: str,
        *,
        status: ItemStatus | None = None,
        destination: str | None = None,
        key_prefix: str | None = None,
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
            key_prefix=key_prefix,
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
        outcome = await self.client.cancel(
            outbox,
            key,
            reason,
            wait=self.cancel_wait,
            known=record.view if record is not None else None,
        )
        if isinstance(outcome, CancelRequested):
            return outcome
        return ItemSnapshot(outcome, None, "workflow")

    async def start_purge(
        self,
        outbox: str,
        operations_task_queue: str,
        destination: str | None = None,
        reason: str = "purged",
    ) -> PurgeBatch:
        """Start a batch that cancels every item of the outbox (optionally of one destination)
        not yet submitted; answers at once with the batch to follow (`purge_batch`)."""
        validate_purge(outbox, destination, self.client.destinations)
        batch_id = uuid.uuid4().hex
        progress = PurgeBatchProgress(outbox, destination, reason)
        temporal = await self.client.temporal()
        await temporal.start_workflow(
            PURGE_BATCH_WORKFLOW_TYPE,
            PurgeBatchInput(operations_task_queue, progress),
            id=purge_batch_workflow_id(outbox, batch_id),
            task_queue=self.client.task_queue,
            static_summary=f"Purge the queued items of {outbox}",
            rpc_timeout=RPC_TIMEOUT,
        )
        return PurgeBatch(batch_id, progress, WorkflowExecutionStatus.RUNNING.name.lower())

    async def purge_batch(self, outbox: str, batch_id: str) -> PurgeBatch:
        """A purge batch's progress; `PurgeBatchNotFound` for an id no purge of the outbox has."""
        validate_outbox(outbox)
        temporal = await self.client.temporal()
        found = await follow_batch(
            temporal,
            purge_batch_workflow_id(outbox, batch_id),
            PURGE_BATCH_WORKFLOW_TYPE,
            PurgeBatchProgress,
        )
        if found is None:
            raise PurgeBatchNotFound(f"no purge batch {batch_id!r} in {outbox}")
        progress, state = found
        return PurgeBatch(batch_id, progress, state)

    async def redrive(self, outbox: str, key: str) -> EnqueueResult:
        """Run a failed item again under its own id, with the destination's current policy; its
        events continue after the newest one the read model holds."""
        record = await self._record(outbox, key)
        if record is None:
            return await self.client.redrive(outbox, key)
        view = record.view
        if view.status in _SETTLED:  # for good; a superseded item has no run of its own
            raise NotRedrivable(f"item is {view.status.value}; only failed items can be redriven")
        erased = functools.partial(attempt_log.erased_at, self.engine, view.id)
        if await asyncio.to_thread(erased) is not None:
            raise ItemErased(f"item {key!r} had its payload erased: there is nothing to send")
        _check_not_pruned(record)
        # Against a concurrent erase or prune: one statement marks it taken, or finds it gone.
        claimed = await asyncio.to_thread(attempt_log.claim_redrive, self.engine, view.id)
        if not claimed:
            if await asyncio.to_thread(erased) is not None:
                raise ItemErased(f"item {key!r} had its payload erased: there is nothing to send")
            now = await asyncio.to_thread(store.get_item, self.engine, view.id)
            if now is not None:
                _check_not_pruned(now)
        events = await asyncio.to_thread(store.item_events, self.engine, view.id)
        # Each generation has its own provider key: the redriven ones so far, plus this one.
        generation = 1 + sum(1 for event in events if event.type == "redriven")
        try:
            return await self.client.redrive(
                outbox,
                key,
                last_event_seq=view.last_event_seq,
                known=view,
                payload=record.payload or {},
                generation=generation,
            )
        except BaseException:
            if claimed:
                await asyncio.to_thread(
                    attempt_log.release_redrive, self.engine, view.id, view.last_event_seq
                )
            raise

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


async def follow_batch(
    temporal: Client, workflow_id: str, workflow_type: str, progress_type: type[Progress]
) -> tuple[Progress, str] | None:
    """A batch workflow's progress and Temporal's word for it (running, completed, failed...);
    None if there is no such batch. Its result once completed, else its `progress` query (a
    closed batch answers too: a worker replays it to its end)."""
    handle = temporal.get_workflow_handle(workflow_id, result_type=progress_type)
    try:
        description = await handle.describe(rpc_timeout=RPC_TIMEOUT)
    except RPCError as err:
        if err.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
            return None
        raise
    if description.workflow_type != workflow_type:
        return None
    status = description.status or WorkflowExecutionStatus.RUNNING
    if status == WorkflowExecutionStatus.COMPLETED:
        return await handle.result(rpc_timeout=RPC_TIMEOUT), status.name.lower()
    progress = await handle.query(
        PROGRESS_QUERY, result_type=progress_type, rpc_timeout=RPC_TIMEOUT
    )
    if getattr(progress, "done", False) and status == WorkflowExecutionStatus.RUNNING:
        # It returned between the describe and the query: done means completed.
        status = WorkflowExecutionStatus.COMPLETED
    return progress, status.name.lower()


def _check_not_pruned(record: ItemRecord) -> None:
    if record.payload_pruned_at is not None:
        raise PayloadPruned(
            f"item {record.view.key!r} ended before its retention and had its payload pruned at"
            f" {record.payload_pruned_at.isoformat()}: there is nothing to send"
        )


def _projected(record: ItemRecord) -> ItemSnapshot:
    return ItemSnapshot(record.view, record.payload, "read-model", record.payload_pruned_at)
