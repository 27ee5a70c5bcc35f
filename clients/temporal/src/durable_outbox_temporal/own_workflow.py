"""Item mode without an ordering key: each item is a workflow of its own, `outbox/{outbox}/{key}`.

Idempotency lives in the workflow id: Temporal refuses a second workflow with the same id, so
two concurrent enqueues of one key start one item.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import (
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import Priority, WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.converter import DataConverter, value_to_type
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from durable_outbox_temporal.contract import search_attributes
from durable_outbox_temporal.contract.ids import item_workflow_id, parse_item_workflow_id
from durable_outbox_temporal.contract.item import (
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
from durable_outbox_temporal.errors import (
    CannotCancel,
    ItemNotFound,
    NotRedrivable,
    UnknownDestination,
    check_same_request,
    failed_use_redrive,
)
from durable_outbox_temporal.fan_out import fan_out
from durable_outbox_temporal.placement import (
    RPC_TIMEOUT,
    CancelRequested,
    EnqueueResult,
    ItemRef,
    Reach,
    Redrive,
)
from durable_outbox_temporal.validation import validate_key, validate_outbox

# Started, task scheduled, task started, task completed: before the 4th event no code has run.
_FIRST_TASK_COMPLETED = 4
_FAILED_STATES = (
    WorkflowExecutionStatus.FAILED,
    WorkflowExecutionStatus.TERMINATED,
    WorkflowExecutionStatus.TIMED_OUT,
)


class OwnWorkflows(Reach):
    """Items that are workflows of their own: started, asked, cancelled and redriven there."""

    own = True

    async def hand_over(self, items: Sequence[OutboxItemInput]) -> list[bool | Exception]:
        """Start each item's workflow (a few at a time); False for a key already started with
        the same request."""
        return await fan_out([partial(self._start_new, item) for item in items])

    async def _start_new(self, item: OutboxItemInput) -> bool:
        try:
            await self._start(item, WorkflowIDReusePolicy.REJECT_DUPLICATE)
        except WorkflowAlreadyStartedError:
            await self._check_existing(item_workflow_id(item.outbox, item.key), item.payload_hash)
            return False
        return True

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
        self, item: ItemRef, reason: str, wait: timedelta
    ) -> OutboxItemView | CancelRequested:
        """The cancel is an update, answered by a worker. When no worker answers within `wait`
        (a worker outage), it is sent again as the `request_cancel` signal, which the server
        records and the item acts on when a worker returns: the answer is then
        `CancelRequested`, not the cancelled view."""
        handle = await self._handle(item.outbox, item.key)
        description = await self._describe(handle)
        if description.status != WorkflowExecutionStatus.RUNNING:
            ended = await self.status(item.outbox, item.key)
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
            return CancelRequested(
                item_id=handle.id, outbox=item.outbox, key=item.key, reason=reason
            )
        except WorkflowUpdateFailedError as err:
            cause = err.cause
            message = cause.message if isinstance(cause, ApplicationError) else str(cause)
            raise CannotCancel(message) from err
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            # It ended between the describe and the update (a fast provider): too late.
            ended = await self.status(item.outbox, item.key)
            raise CannotCancel(f"too late: the item is already {ended.status.value}") from None
        if view.status is not ItemStatus.CANCELLED:
            raise CannotCancel(f"too late: the item is already {view.status.value}")
        return view

    async def redrive(self, item: ItemRef, again: Redrive) -> EnqueueResult:
        """Start a permanently failed item again under the same id, with fresh attempts and its
        own generation; `again.payload` is not needed (the first run's input has it).

        `again.last_event_seq`: a run that ended through our own code reports its own; a
        terminated or timed-out run cannot, and the new run must continue the sequence (the
        read model ignores events it already has), so the service layer passes the read
        model's."""
        outbox, key = item.outbox, item.key
        handle = await self._handle(outbox, key)
        description = await self._describe(handle)
        if description.status not in _FAILED_STATES:
            status = description.status.name.lower() if description.status else "unknown"
            raise NotRedrivable(f"item is {status}; only failed items can be redriven")
        previous = await self._original_input(handle)
        view = await self._failed_view(handle)
        replay = replace(
            previous,
            enqueued_at=previous.enqueued_at,
            not_before=None,
            state=OutboxItemState(
                created_at=view.created_at if view else previous.enqueued_at,
                last_event_seq=max(view.last_event_seq if view else 0, again.last_event_seq),
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
            replay.policy = target.policy()
        try:
            await self._start(replay, WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY)
        except WorkflowAlreadyStartedError:
            # A concurrent redrive won; the item is running again either way.
            return EnqueueResult(item_id=handle.id, outbox=outbox, key=key, created=False)
        return EnqueueResult(item_id=handle.id, outbox=outbox, key=key, created=True)

    async def report(self, item: ItemRef, report: DeliveryReport) -> bool:
        return await self.signal(item.id, DELIVERY_REPORT_SIGNAL, report)

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
        client = await self._temporal()
        return [
            parse_item_workflow_id(execution.id)[1]
            async for execution in client.list_workflows(query, rpc_timeout=RPC_TIMEOUT)
        ]

    async def _start(self, item: OutboxItemInput, reuse: WorkflowIDReusePolicy) -> None:
        start_delay = None
        if item.not_before is not None:
            # One reading of the clock: two could straddle the due time and give a negative delay.
            remaining = item.not_before - datetime.now(UTC)
            start_delay = remaining if remaining > timedelta(0) else None
        client = await self._temporal()
        await client.start_workflow(
            WORKFLOW_TYPE,
            item,
            id=item_workflow_id(item.outbox, item.key),
            task_queue=self._task_queue,
            id_reuse_policy=reuse,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            search_attributes=search_attributes.item_start_attributes(
                item.outbox, item.destination, ItemStatus.QUEUED.value, item.ordering_key
            ),
            memo={"payload_hash": item.payload_hash},
            static_summary=item.summary(),
            start_delay=start_delay,
            # Its first workflow task goes ahead of less urgent items'
            # (`durable_outbox_temporal/contract/priority.py`).
            priority=Priority(priority_key=item.priority),
            rpc_timeout=RPC_TIMEOUT,
        )

    async def _check_existing(self, item_id: str, fingerprint: str) -> None:
        client = await self._temporal()
        description = await client.get_workflow_handle(item_id).describe(rpc_timeout=RPC_TIMEOUT)
        check_same_request(await description.memo_value("payload_hash", default=None), fingerprint)
        if description.status in _FAILED_STATES:
            raise failed_use_redrive()

    async def _handle(self, outbox: str, key: str) -> WorkflowHandle[Any, OutboxItemView]:
        validate_outbox(outbox)
        validate_key(key)
        client = await self._temporal()
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
                client = await self._temporal()
                converter = client.data_converter or DataConverter.default
                decoded = await converter.decode(payloads, [OutboxItemInput])
                item: OutboxItemInput = decoded[0]
                # The first run's input; a continued-as-new run's state is not wanted here.
                return replace(item, state=None)
        raise ItemNotFound(f"no start event for {handle.id!r}")


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
