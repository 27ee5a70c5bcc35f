"""`OutboxClient`: enqueue, inspect, cancel and redrive items directly through Temporal.

The REST API is a thin layer over this class, and other Python services may use it instead of
REST. Idempotency lives in the workflow id (`outbox/{outbox}/{key}`): Temporal refuses a second
workflow with the same id, so two concurrent enqueues of one key start one item.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import (
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.converter import DataConverter, value_to_type
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from common.destinations import Destination, DestinationRegistry
from contract import search_attributes
from contract.bulk import (
    CANCEL_ITEM_SIGNAL,
    ENQUEUE_SIGNAL,
    ITEM_REPORT_SIGNAL,
    MAX_BATCH,
    SHARD_WORKFLOW_TYPE,
    ItemCancel,
    ItemReport,
    ShardEnqueue,
    ShardInput,
    owner_id,
    shard_of,
    shard_workflow_id,
)
from contract.ids import (
    WORKFLOW_TASK_QUEUE,
    item_workflow_id,
    parse_item_workflow_id,
    payload_hash,
)
from contract.item import (
    CANCEL_UPDATE,
    DELIVERY_REPORT_SIGNAL,
    REQUEST_CANCEL_SIGNAL,
    STATUS_QUERY,
    WORKFLOW_TYPE,
    CancelRequest,
    DeliveryReport,
    ItemStatus,
    OutboxItemInput,
    OutboxItemState,
    OutboxItemView,
)
from contract.lane import AppendOutcome, LaneDetail, RemoveRequest
from outbox_client import lanes
from outbox_client.connection import TemporalConnection
from outbox_client.errors import (
    CannotCancel,
    IdempotencyConflict,
    ItemFailedUseRedrive,
    ItemNotFound,
    NotRedrivable,
    UnknownDestination,
)
from outbox_client.mailbox import Mailbox
from outbox_client.placement import item_holder
from outbox_client.placement import lane_holder as lanes_holder
from outbox_client.validation import (
    validate_key,
    validate_new_item,
    validate_ordering_key,
    validate_outbox,
)

# Every call to Temporal gets a deadline, so a blackholed server answers the API's caller with a
# 503 instead of holding the request open. Only calls on ended workflows or quick handlers wait.
RPC_TIMEOUT = timedelta(seconds=10)
log = logging.getLogger("outbox.client")
# Writes a just-started item's `queued` row: (item id, its input).
RecordQueued = Callable[[str, OutboxItemInput], Awaitable[None]]
# How long a cancel waits for a worker to answer before it falls back to a signal.
CANCEL_WAIT = timedelta(seconds=5)
# Started, task scheduled, task started, task completed: before the 4th event no code has run.
_FIRST_TASK_COMPLETED = 4
_FAILED_STATES = (
    WorkflowExecutionStatus.FAILED,
    WorkflowExecutionStatus.TERMINATED,
    WorkflowExecutionStatus.TIMED_OUT,
)


# A batch's items as JSON, at most: well under Temporal's 2 MB payload limit.
MAX_SIGNAL_BYTES = 512 * 1024


@dataclass(frozen=True)
class _Handed:
    """An item on its way to its shard (every item in one mailbox goes to one shard)."""

    shard: int
    item: OutboxItemInput


@dataclass
class CancelRequested:
    """No worker answered the cancel in time; the `request_cancel` signal is recorded instead
    and takes effect (if the item is still queued) when a worker runs the item again."""

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


class OutboxClient:
    """Typed access to outbox items for any Python service; no REST involved.

    Args:
        client: a connected Temporal client (see `outbox_client.connect`), or a
            `TemporalConnection` that connects on first use.
        destinations: the configured destinations; an item snapshots its destination's
            delivery policy when it is enqueued.
        task_queue: the task queue the workflow worker polls (`WORKFLOW_TASK_QUEUE`).
    """

    def __init__(
        self,
        client: Client | TemporalConnection,
        destinations: DestinationRegistry,
        task_queue: str = WORKFLOW_TASK_QUEUE,
    ) -> None:
        self._client = client
        self.destinations = destinations
        self.task_queue = task_queue
        self._appender = lanes.LaneAppender(self.temporal, task_queue)
        self._shard_signals: Mailbox[_Handed, None] = Mailbox(
            self._signal_shard,
            max_batch=MAX_BATCH,
            size=lambda handed: len(json.dumps(handed.item.payload, default=str)),
            max_size=MAX_SIGNAL_BYTES,
        )

    @property
    def connection(self) -> Client | TemporalConnection:
        """What this client reaches Temporal through, to share with an `AggregateClient`."""
        return self._client

    async def temporal(self) -> Client:
        """The Temporal client; raises `TemporalUnavailable` while it cannot connect."""
        if isinstance(self._client, Client):
            return self._client
        return await self._client.client()

    async def enqueue(
        self,
        outbox: str,
        destination: str,
        payload: dict[str, Any],
        *,
        key: str | None = None,
        ordering_key: str | None = None,
        not_before: datetime | None = None,
        max_attempts: int | None = None,
        record_queued: RecordQueued | None = None,
    ) -> EnqueueResult:
        """Start the item's workflow, or return the existing item for a repeated key.

        Args:
            outbox: the outbox (a namespace of keys), e.g. `billing`.
            destination: a configured destination name.
            payload: what the provider receives (ACS email body, webhook JSON).
            key: the idempotency key; a fresh UUID when None. Repeating it returns the
                existing item, or raises `IdempotencyConflict` if the request differs.
            ordering_key: deliver strictly after the outbox's earlier items with this key: the
                item is appended to its ordering lane, which runs it when its turn comes.
                Raises `LaneFull` when the lane carries as much as it can.
            not_before: deliver no earlier than this (time-zone aware).
            max_attempts: lower the destination's attempt limit for this item.
            record_queued: for a caller with the read model: writes the new item's `queued`
                row (`contract.transitions.enqueued`) right after the start, which spares the
                item a local activity. Not used for an item of an ordering lane (its lane
                writes it).
        """
        item = self.new_item(
            outbox,
            destination,
            payload,
            key=key,
            ordering_key=ordering_key,
            not_before=not_before,
            max_attempts=max_attempts,
        )
        key, item_id = item.key, item_workflow_id(outbox, item.key)
        target = self._destination(destination)
        item.enqueue_projected = record_queued is not None
        if ordering_key is not None and target.mode != "bulk":
            created = await self._append_to_lane(item)
            if created:
                await self._record_queued(record_queued, item_id, item)
            return EnqueueResult(item_id=item_id, outbox=outbox, key=key, created=created)
        if target.mode == "bulk":
            await self.hand_to_shards([item], target.shards)
            await self._record_queued(record_queued, item_id, item)
            # The shard ignores an item it holds or finished lately; repeats of older items are
            # the read model's to answer (`ItemService` asks it first).
            return EnqueueResult(item_id=item_id, outbox=outbox, key=key, created=True)
        try:
            await self._start(item, WorkflowIDReusePolicy.REJECT_DUPLICATE)
        except WorkflowAlreadyStartedError:
            await self._check_existing(item_id, item.payload_hash)
            return EnqueueResult(item_id=item_id, outbox=outbox, key=key, created=False)
        await self._record_queued(record_queued, item_id, item)
        return EnqueueResult(item_id=item_id, outbox=outbox, key=key, created=True)

    def new_item(
        self,
        outbox: str,
        destination: str,
        payload: dict[str, Any],
        *,
        key: str | None = None,
        ordering_key: str | None = None,
        not_before: datetime | None = None,
        max_attempts: int | None = None,
    ) -> OutboxItemInput:
        """A new item's input, validated (the arguments are `enqueue`'s); starts nothing."""
        key = key if key is not None else str(uuid.uuid4())
        now = datetime.now(UTC)
        validate_new_item(
            outbox,
            key,
            ordering_key=ordering_key,
            not_before=not_before,
            max_attempts=max_attempts,
            now=now,
        )
        target = self._destination(destination)
        return OutboxItemInput(
            outbox=outbox,
            key=key,
            destination=destination,
            payload=payload,
            payload_hash=payload_hash(destination, payload, ordering_key),
            policy=target.policy(max_attempts),
            ordering_key=ordering_key,
            enqueued_at=now,
            not_before=not_before,
            upsert_sending=False,
            activities_project=True,
        )

    def _destination(self, name: str) -> Destination:
        target = self.destinations.get(name)
        if target is None:
            known = ", ".join(self.destinations.names) or "none"
            raise UnknownDestination(f"unknown destination {name!r} (configured: {known})")
        return target

    async def hand_to_shards(self, items: list[OutboxItemInput], shards: int) -> None:
        """Hand bulk-mode items (of one destination) to their shards, in order.

        Concurrent calls share signals: each shard gets one signal-with-start at a time from
        this process, carrying every item handed to it meanwhile in the order they came (up to
        `MAX_BATCH` items or `MAX_SIGNAL_BYTES`), so a busy lane's thousands of enqueues reach
        its shard as a few dozen signals, not thousands its workflow tasks must take in."""
        calls = []
        for item in items:
            # Every item of an ordering key goes to the shard that owns the key, in order.
            shard = shard_of(owner_id(item.outbox, item.key, item.ordering_key), shards)
            calls.append(
                self._shard_signals.call(
                    shard_workflow_id(item.destination, shard), _Handed(shard, item)
                )
            )
        await asyncio.gather(*calls)

    async def _signal_shard(self, workflow_id: str, handed: list[_Handed]) -> list[None]:
        """One signal-with-start carrying a mailbox's batch of items to their shard."""
        held = [entry.item for entry in handed]
        destination, shard = held[0].destination, handed[0].shard
        target = self.destinations.get(destination)
        poll_batch = target.poll_batch if target is not None else 1
        submit_batch = target.submit_batch if target is not None else 1
        await lanes.signal_with_start(
            await self.temporal(),
            SHARD_WORKFLOW_TYPE,
            ShardInput(
                destination=destination,
                shard=shard,
                poll_batch=poll_batch,
                submit_batch=submit_batch,
            ),
            id=workflow_id,
            task_queue=self.task_queue,
            start_signal=ENQUEUE_SIGNAL,
            start_signal_args=[
                ShardEnqueue(
                    items=held,
                    poll_batch=poll_batch,
                    submit_batch=submit_batch,
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

    @staticmethod
    async def _record_queued(
        record_queued: RecordQueued | None, item_id: str, item: OutboxItemInput
    ) -> None:
        if record_queued is None:
            return
        try:
            await record_queued(item_id, item)
        except Exception as err:
            # The item is started and its first submit writes the row: only the moments before
            # it (or a paused destination's wait) lack it in the read model.
            log.warning("queued row of %s left to its first submit: %s", item_id, err)

    async def _append_to_lane(self, item: OutboxItemInput) -> bool:
        """Append to the item's item-mode lane; whether this call added it (False: it was
        there). Raises `IdempotencyConflict` or `LaneFull`."""
        assert item.ordering_key is not None
        settings = self.destinations.outbox(item.outbox)
        outcome = await self._appender.append(item, settings)
        if outcome is AppendOutcome.CONFLICT:
            check_same_request(None, item.payload_hash)
        if outcome is AppendOutcome.FULL:
            raise lanes.lane_full(item.outbox, item.ordering_key)
        return outcome is not AppendOutcome.DUPLICATE

    async def status(self, outbox: str, key: str) -> OutboxItemView:
        """The item's live view while it runs; its final view once it has ended."""
        handle = await self._handle(outbox, key)
        description = await self._describe(handle)
        if description.status == WorkflowExecutionStatus.COMPLETED:
            return await handle.result(rpc_timeout=RPC_TIMEOUT)
        if description.status in _FAILED_STATES:
            failed = await self._failed_view(handle)
            if failed is not None:
                return failed
        if description.history_length < _FIRST_TASK_COMPLETED:
            # Not started yet (a `not_before` delay, or a backlog of workflow tasks): nothing can
            # answer a query, and the start input says all there is to say.
            return _pending_view(handle.id, await self._original_input(handle), description)
        live: OutboxItemView = await handle.query(
            STATUS_QUERY, result_type=OutboxItemView, rpc_timeout=RPC_TIMEOUT
        )
        return live

    async def cancel(
        self,
        outbox: str,
        key: str,
        reason: str = "cancelled by request",
        *,
        wait: timedelta = CANCEL_WAIT,
        ordering_key: str | None = None,
    ) -> OutboxItemView | CancelRequested:
        """Cancel a queued item. Raises `CannotCancel` once it has been handed to the provider.

        The cancel is an update, answered by a worker. When no worker answers within `wait`
        (a worker outage), it is sent again as the `request_cancel` signal, which the server
        records and the item acts on when a worker returns: the answer is then
        `CancelRequested`, not the cancelled view. An item still waiting in its ordering lane
        (pass its `ordering_key`) has no workflow yet: the lane takes it out.
        """
        if ordering_key is not None:
            return await self._cancel_in_lane(outbox, key, ordering_key, reason, wait)
        handle = await self._handle(outbox, key)
        description = await self._describe(handle)
        if description.status != WorkflowExecutionStatus.RUNNING:
            ended = await self.status(outbox, key)
            raise CannotCancel(f"item is {ended.status.value}; only queued items can be cancelled")
        try:
            view: OutboxItemView = await handle.execute_update(
                CANCEL_UPDATE,
                CancelRequest(reason=reason),
                result_type=OutboxItemView,
                rpc_timeout=wait,
            )
        except WorkflowUpdateRPCTimeoutOrCancelledError:
            await handle.signal(
                REQUEST_CANCEL_SIGNAL, CancelRequest(reason=reason), rpc_timeout=RPC_TIMEOUT
            )
            return CancelRequested(item_id=handle.id, outbox=outbox, key=key, reason=reason)
        except WorkflowUpdateFailedError as err:
            cause = err.cause
            message = cause.message if isinstance(cause, ApplicationError) else str(cause)
            raise CannotCancel(message) from err
        if view.status is not ItemStatus.CANCELLED:
            raise CannotCancel(f"too late: the item is already {view.status.value}")
        return view

    async def _cancel_in_lane(
        self, outbox: str, key: str, ordering_key: str, reason: str, wait: timedelta
    ) -> OutboxItemView | CancelRequested:
        """Cancel an item of an item-mode lane: the lane takes it out, or cancels its head if
        the provider does not have it yet."""
        _validate(outbox, key)
        client = await self.temporal()
        holder = lanes_holder(outbox, ordering_key, None)
        request = RemoveRequest(key=key, reason=reason, outbox=outbox, ordering_key=ordering_key)
        try:
            removed = await lanes.remove(client, holder, request, wait=wait)
        except WorkflowUpdateRPCTimeoutOrCancelledError:
            # No worker answered: the lane acts on the signal when one returns.
            await client.get_workflow_handle(holder).signal(
                CANCEL_ITEM_SIGNAL,
                ItemCancel(item_workflow_id(outbox, key), CancelRequest(reason=reason)),
                rpc_timeout=RPC_TIMEOUT,
            )
            item_id = item_workflow_id(outbox, key)
            return CancelRequested(item_id=item_id, outbox=outbox, key=key, reason=reason)
        for taken in removed.views:
            if taken.key == key:
                return taken
        if removed.head is not None:
            if removed.head.status is ItemStatus.QUEUED:
                raise CannotCancel("the item is being submitted now; it can no longer be cancelled")
            raise CannotCancel(
                f"item is {removed.head.status.value}; only queued items can be cancelled"
            )
        raise CannotCancel("the item is no longer waiting in its lane")

    async def queued_keys(self, outbox: str, destination: str | None = None) -> list[str]:
        """Keys of the outbox's running items, from Temporal's visibility: every one not yet
        handed to the provider (queued, delayed, backing off), which visibility knows before the
        read model does, and those in flight, which read `queued` there until they end (a
        cancel refuses them). Visibility trails by a moment: one enqueued just now may be
        missing."""
        validate_outbox(outbox)
        query = (
            f"WorkflowType = '{WORKFLOW_TYPE}' AND ExecutionStatus = 'Running'"
            f" AND {search_attributes.OUTBOX_NAME.name} = '{outbox}'"
            f" AND {search_attributes.OUTBOX_STATUS.name} = '{ItemStatus.QUEUED.value}'"
        )
        if destination is not None:
            if self.destinations.get(destination) is None:
                raise UnknownDestination(f"unknown destination {destination!r}")
            query += f" AND {search_attributes.DESTINATION.name} = '{destination}'"
        client = await self.temporal()
        return [
            parse_item_workflow_id(execution.id)[1]
            async for execution in client.list_workflows(query, rpc_timeout=RPC_TIMEOUT)
        ]

    async def purge_lanes(
        self, outbox: str, destination: str | None = None, reason: str = "purged"
    ) -> list[str]:
        """Take every item waiting in the outbox's lanes out (optionally of one destination);
        the keys taken. Items running at a lane's head are the item purge's to cancel."""
        validate_outbox(outbox)
        client = await self.temporal()
        removed: list[str] = []
        request = RemoveRequest(destination=destination, reason=reason, outbox=outbox)
        for ordering_key in await lanes.running_lanes(client, outbox, rpc_timeout=RPC_TIMEOUT):
            holder = lanes_holder(outbox, ordering_key, None)
            result = await lanes.remove(client, holder, request, wait=CANCEL_WAIT)
            removed.extend(result.removed)
        return removed

    async def lane(
        self, outbox: str, ordering_key: str, destination: str | None = None
    ) -> LaneDetail | None:
        """A running lane's live view and its first waiting keys; None if it is not running.

        `destination`: the bulk-mode destination whose shard holds the lane (None: the lane's
        own workflow, item mode)."""
        validate_outbox(outbox)
        validate_ordering_key(ordering_key)
        holder = lanes_holder(outbox, ordering_key, self._bulk(destination))
        return await lanes.detail(await self.temporal(), holder, outbox, ordering_key)

    async def resume_lane(
        self,
        outbox: str,
        ordering_key: str,
        *,
        skip_reason: str | None = None,
        last_event_seq: int = 0,
        head_destination: str | None = None,
        destination: str | None = None,
    ) -> str:
        """Resume a halted lane by redriving its failed head item (with `head_destination`'s
        current policy, when given), or by skipping it when `skip_reason` is given; the head's
        key. `destination`: as for `lane`.

        `last_event_seq`: as for `redrive`, the newest event the caller's read model holds."""
        target = self.destinations.get(head_destination) if head_destination else None
        policy = target.policy() if target is not None and skip_reason is None else None
        return await lanes.resume(
            await self.temporal(),
            lanes_holder(outbox, ordering_key, self._bulk(destination)),
            outbox,
            ordering_key,
            redrive_policy=policy,
            last_event_seq=last_event_seq,
            skip_reason=skip_reason,
            rpc_timeout=RPC_TIMEOUT,
        )

    def _bulk(self, destination: str | None) -> Destination | None:
        target = self.destinations.get(destination) if destination else None
        return target if target is not None and target.mode == "bulk" else None

    async def report_delivery(
        self,
        item_id: str,
        report: DeliveryReport,
        destination: str | None = None,
        *,
        ordering_key: str | None = None,
    ) -> bool:
        """Signal the provider's report on one recipient to the workflow holding the item.

        False when that workflow has ended (the item's report window is over) or does not
        exist; the signal needs no worker, so a report is never lost to a worker outage.
        """
        client = await self.temporal()
        outbox, key = parse_item_workflow_id(item_id)
        target = self.destinations.get(destination) if destination else None
        holder = item_holder(outbox, key, ordering_key, target)
        try:
            handle = client.get_workflow_handle(holder.workflow_id)
            if holder.own:
                await handle.signal(DELIVERY_REPORT_SIGNAL, report, rpc_timeout=RPC_TIMEOUT)
            else:
                await handle.signal(
                    ITEM_REPORT_SIGNAL, ItemReport(item_id, report), rpc_timeout=RPC_TIMEOUT
                )
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return False
            raise
        return True

    async def cancel_bulk(self, item: OutboxItemView, reason: str) -> CancelRequested:
        """Cancel a bulk-mode item: its shard cancels it if it is still queued when the signal
        arrives (the read model then shows `cancelled`); no worker needs to answer first."""
        outbox, key = item.outbox, item.key
        holder = item_holder(outbox, key, item.ordering_key, self._bulk(item.destination))
        assert not holder.own, "not a bulk-mode item"
        client = await self.temporal()
        try:
            await client.get_workflow_handle(holder.workflow_id).signal(
                CANCEL_ITEM_SIGNAL,
                ItemCancel(item.id, CancelRequest(reason=reason)),
                rpc_timeout=RPC_TIMEOUT,
            )
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise CannotCancel(f"item is {item.status.value}; its shard has ended") from err
            raise
        return CancelRequested(item_id=item.id, outbox=outbox, key=key, reason=reason)

    async def redrive_held(
        self, item: OutboxItemView, payload: dict[str, Any], generation: int
    ) -> EnqueueResult:
        """Hand a failed item that has no workflow of its own (bulk mode, or an item-mode lane's
        item) to its holder again, as generation `generation` (its own provider key), with the
        destination's current policy; its events continue after the newest one the caller's
        read model holds. An item of a lane goes to the lane's tail."""
        target = self._destination(item.destination)
        again = OutboxItemInput(
            outbox=item.outbox,
            key=item.key,
            destination=item.destination,
            payload=payload,
            payload_hash=item.payload_hash or "",
            policy=target.policy(),
            ordering_key=item.ordering_key,
            enqueued_at=datetime.now(UTC),
            state=OutboxItemState(created_at=item.created_at, last_event_seq=item.last_event_seq),
            generation=generation,
            upsert_sending=False,
            activities_project=True,
        )
        if target.mode == "bulk":
            await self.hand_to_shards([again], target.shards)
        else:
            created = await self._append_to_lane(again)
            if not created:
                raise NotRedrivable("the item is waiting in its lane already")
        return EnqueueResult(item_id=item.id, outbox=item.outbox, key=item.key, created=True)

    async def redrive(self, outbox: str, key: str, *, last_event_seq: int = 0) -> EnqueueResult:
        """Start a permanently failed item again under the same id, with fresh attempts.

        Args:
            last_event_seq: the newest event seq the caller's read model holds for the item. A
                run that ended through our own code reports its own; a terminated or timed-out
                run cannot, and the new run must continue the sequence (the read model ignores
                events it already has), so the service layer passes the read model's.
        """
        handle = await self._handle(outbox, key)
        description = await self._describe(handle)
        if description.status not in _FAILED_STATES:
            status = description.status.name.lower() if description.status else "unknown"
            raise NotRedrivable(f"item is {status}; only failed items can be redriven")
        previous = await self._original_input(handle)
        view = await self._failed_view(handle)
        item = replace(
            previous,
            enqueued_at=previous.enqueued_at,
            not_before=None,
            state=OutboxItemState(
                created_at=view.created_at if view else previous.enqueued_at,
                last_event_seq=max(view.last_event_seq if view else 0, last_event_seq),
            ),
            # A new generation gets its own provider idempotency key: a deduping provider would
            # answer the old one with the operation that failed.
            generation=previous.generation + 1,
            upsert_sending=False,
            activities_project=True,
            enqueue_projected=False,
        )
        # Redrive uses the destination's current policy: the usual reason to redrive is that
        # its configuration was fixed.
        target = self.destinations.get(previous.destination)
        if target is not None:
            item.policy = target.policy()
        try:
            await self._start(item, WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY)
        except WorkflowAlreadyStartedError:
            # A concurrent redrive won; the item is running again either way.
            return EnqueueResult(item_id=handle.id, outbox=outbox, key=key, created=False)
        return EnqueueResult(item_id=handle.id, outbox=outbox, key=key, created=True)

    async def _start(self, item: OutboxItemInput, reuse: WorkflowIDReusePolicy) -> None:
        start_delay = None
        if item.not_before is not None:
            # One reading of the clock: two could straddle the due time and give a negative delay.
            remaining = item.not_before - datetime.now(UTC)
            start_delay = remaining if remaining > timedelta(0) else None
        client = await self.temporal()
        await client.start_workflow(
            WORKFLOW_TYPE,
            item,
            id=item_workflow_id(item.outbox, item.key),
            task_queue=self.task_queue,
            id_reuse_policy=reuse,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            search_attributes=search_attributes.item_start_attributes(
                item.outbox, item.destination, ItemStatus.QUEUED.value, item.ordering_key
            ),
            memo={"payload_hash": item.payload_hash},
            static_summary=item.summary(),
            start_delay=start_delay,
            rpc_timeout=RPC_TIMEOUT,
        )

    async def _check_existing(self, item_id: str, fingerprint: str) -> None:
        client = await self.temporal()
        description = await client.get_workflow_handle(item_id).describe(rpc_timeout=RPC_TIMEOUT)
        check_same_request(await description.memo_value("payload_hash", default=None), fingerprint)
        if description.status in _FAILED_STATES:
            raise failed_use_redrive()

    async def _handle(self, outbox: str, key: str) -> WorkflowHandle[Any, OutboxItemView]:
        _validate(outbox, key)
        client = await self.temporal()
        return client.get_workflow_handle(item_workflow_id(outbox, key), result_type=OutboxItemView)

    async def _describe(
        self, handle: WorkflowHandle[Any, OutboxItemView]
    ) -> WorkflowExecutionDescription:
        try:
            return await handle.describe(rpc_timeout=RPC_TIMEOUT)
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise ItemNotFound(f"no item {handle.id!r}") from err
            raise

    async def _failed_view(
        self, handle: WorkflowHandle[Any, OutboxItemView]
    ) -> OutboxItemView | None:
        """The view a failed item attached to its failure, if it ended through our own code."""
        try:
            await handle.result(rpc_timeout=RPC_TIMEOUT)
        except WorkflowFailureError as err:
            cause = err.cause
            if isinstance(cause, ApplicationError) and cause.details:
                view: OutboxItemView = value_to_type(OutboxItemView, cause.details[0])
                return view
        return None

    async def _original_input(self, handle: WorkflowHandle[Any, OutboxItemView]) -> OutboxItemInput:
        async for event in handle.fetch_history_events(rpc_timeout=RPC_TIMEOUT):
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                payloads = event.workflow_execution_started_event_attributes.input.payloads
                client = await self.temporal()
                converter = client.data_converter or DataConverter.default
                decoded = await converter.decode(payloads, [OutboxItemInput])
                item: OutboxItemInput = decoded[0]
                # The first run's input; a continued-as-new run's state is not wanted here.
                return replace(item, state=None)
        raise ItemNotFound(f"no start event for {handle.id!r}")


def check_same_request(existing_hash: str | None, requested_hash: str) -> None:
    """Raise `IdempotencyConflict` unless the key's item was asked for with the same request."""
    if existing_hash != requested_hash:
        raise IdempotencyConflict(
            "this Idempotency-Key is already used by an item with a different destination,"
            " payload or ordering key"
        )


def failed_use_redrive() -> ItemFailedUseRedrive:
    """The answer to re-enqueueing a key whose item failed permanently."""
    return ItemFailedUseRedrive(
        "the item with this Idempotency-Key failed permanently; redrive it to try again"
    )


def _validate(outbox: str, key: str) -> None:
    validate_outbox(outbox)
    validate_key(key)


def _pending_view(
    item_id: str, item: OutboxItemInput, description: WorkflowExecutionDescription
) -> OutboxItemView:
    """What a not-yet-started item shows: its start input, queued until its start time."""
    waiting = OutboxItemState(
        created_at=item.enqueued_at,
        updated_at=item.enqueued_at,
        next_attempt_at=description.execution_time or item.not_before,
    )
    return OutboxItemView.of(item_id, item, waiting)
