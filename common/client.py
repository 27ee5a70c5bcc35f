"""`OutboxClient`: enqueue, inspect, cancel and redrive items directly through Temporal.

The REST API is a thin layer over this class, and other Python services may use it instead of
REST. Idempotency lives in the workflow id (`outbox/{outbox}/{key}`): Temporal refuses a second
workflow with the same id, so two concurrent enqueues of one key start one item.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.converter import DataConverter, value_to_type
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.runtime import Runtime
from temporalio.service import RPCError, RPCStatusCode, TLSConfig

from common import search_attributes
from common.destinations import DestinationRegistry
from common.ids import (
    MAX_KEY_LENGTH,
    MAX_OUTBOX_LENGTH,
    WORKFLOW_TASK_QUEUE,
    item_workflow_id,
    payload_hash,
)
from common.models import (
    CancelRequest,
    ItemStatus,
    OutboxItemInput,
    OutboxItemState,
    OutboxItemView,
)
from common.settings import Settings
from workflows.outbox_item import CANCEL_UPDATE, STATUS_QUERY, OutboxItemWorkflow

_OUTBOX_NAME = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_OUTBOX_LENGTH - 1}}}$")
# Every call to Temporal gets a deadline, so a blackholed server answers the API's caller with a
# 503 instead of holding the request open. Only calls on ended workflows or quick handlers wait.
RPC_TIMEOUT = timedelta(seconds=10)
# Printable characters only (the key is part of a workflow id shown in UIs and logs), and no
# "/", so a key is always exactly one URL path segment in the REST API.
_KEY = re.compile(rf"^[^\x00-\x1f\x7f/]{{1,{MAX_KEY_LENGTH}}}$")
# Started, task scheduled, task started, task completed: before the 4th event no code has run.
_FIRST_TASK_COMPLETED = 4
_FAILED_STATES = (
    WorkflowExecutionStatus.FAILED,
    WorkflowExecutionStatus.TERMINATED,
    WorkflowExecutionStatus.TIMED_OUT,
)


class OutboxError(Exception):
    """Base of the client's errors; the API maps each subclass to one problem+json status."""


class InvalidRequest(OutboxError):
    """The outbox name, key or another argument is malformed."""


class UnknownDestination(OutboxError):
    """No destination of that name is configured."""


class IdempotencyConflict(OutboxError):
    """The key is already used by an item with a different destination, payload or lane."""


class ItemFailedUseRedrive(OutboxError):
    """The key belongs to an item that failed permanently; redrive it instead of re-enqueueing."""


class ItemNotFound(OutboxError):
    """No item with that outbox and key exists."""


class CannotCancel(OutboxError):
    """The item is past the point where cancelling could stop it."""


class NotRedrivable(OutboxError):
    """Only failed (or terminated, or timed-out) items can be redriven."""


@dataclass
class EnqueueResult:
    """The item's id and whether this call created it (False: an existing item was returned)."""

    item_id: str
    outbox: str
    key: str
    created: bool


async def connect(
    settings: Settings, *, lazy: bool = False, runtime: Runtime | None = None
) -> Client:
    """A Temporal client for the configured cluster: dev server, self-hosted mTLS, or Cloud.

    `lazy` connects on first use, so the API can start (and report not-ready) while Temporal
    is still coming up.
    """
    tls: TLSConfig | bool = settings.temporal_tls or settings.temporal_api_key is not None
    if settings.temporal_tls_cert and settings.temporal_tls_key:
        tls = TLSConfig(
            client_cert=settings.temporal_tls_cert.read_bytes(),
            client_private_key=settings.temporal_tls_key.read_bytes(),
            server_root_ca_cert=(
                settings.temporal_tls_server_ca.read_bytes()
                if settings.temporal_tls_server_ca
                else None
            ),
        )
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        api_key=settings.temporal_api_key,
        tls=tls,
        lazy=lazy,
        runtime=runtime,
    )


class OutboxClient:
    """Typed access to outbox items for any Python service; no REST involved."""

    def __init__(
        self,
        client: Client,
        destinations: DestinationRegistry,
        task_queue: str = WORKFLOW_TASK_QUEUE,
    ) -> None:
        self.client = client
        self.destinations = destinations
        self.task_queue = task_queue

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
    ) -> EnqueueResult:
        """Start the item's workflow, or return the existing item for a repeated key."""
        key = key if key is not None else str(uuid.uuid4())
        _validate(outbox, key)
        target = self.destinations.get(destination)
        if target is None:
            known = ", ".join(self.destinations.names) or "none"
            raise UnknownDestination(f"unknown destination {destination!r} (configured: {known})")
        if ordering_key is not None:
            _validate_text(ordering_key, "ordering key")
        if max_attempts is not None and max_attempts < 1:
            raise InvalidRequest("max_attempts must be at least 1")
        item_id = item_workflow_id(outbox, key)
        fingerprint = payload_hash(destination, payload, ordering_key)
        now = datetime.now(UTC)
        item = OutboxItemInput(
            outbox=outbox,
            key=key,
            destination=destination,
            payload=payload,
            payload_hash=fingerprint,
            policy=target.policy(max_attempts),
            ordering_key=ordering_key,
            enqueued_at=now,
            not_before=not_before,
        )
        try:
            await self._start(item, WorkflowIDReusePolicy.REJECT_DUPLICATE)
        except WorkflowAlreadyStartedError:
            await self._check_existing(item_id, fingerprint)
            return EnqueueResult(item_id=item_id, outbox=outbox, key=key, created=False)
        return EnqueueResult(item_id=item_id, outbox=outbox, key=key, created=True)

    async def status(self, outbox: str, key: str) -> OutboxItemView:
        """The item's live view while it runs; its final view once it has ended."""
        handle = self._handle(outbox, key)
        description = await self._describe(handle)
        if description.status == WorkflowExecutionStatus.COMPLETED:
            view: OutboxItemView = await handle.result(rpc_timeout=RPC_TIMEOUT)
            return view
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
        self, outbox: str, key: str, reason: str = "cancelled by request"
    ) -> OutboxItemView:
        """Cancel a queued item. Raises `CannotCancel` once it has been handed to the provider."""
        handle = self._handle(outbox, key)
        description = await self._describe(handle)
        if description.status != WorkflowExecutionStatus.RUNNING:
            ended = await self.status(outbox, key)
            raise CannotCancel(f"item is {ended.status.value}; only queued items can be cancelled")
        try:
            view: OutboxItemView = await handle.execute_update(
                CANCEL_UPDATE,
                CancelRequest(reason=reason),
                result_type=OutboxItemView,
                rpc_timeout=RPC_TIMEOUT,
            )
        except WorkflowUpdateFailedError as err:
            cause = err.cause
            message = cause.message if isinstance(cause, ApplicationError) else str(cause)
            raise CannotCancel(message) from err
        if view.status is not ItemStatus.CANCELLED:
            raise CannotCancel(f"too late: the item is already {view.status.value}")
        return view

    async def redrive(self, outbox: str, key: str) -> EnqueueResult:
        """Start a permanently failed item again under the same id, with fresh attempts."""
        _validate(outbox, key)
        handle = self._handle(outbox, key)
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
                last_event_seq=view.last_event_seq if view else 0,
            ),
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
        pairs = [
            SearchAttributePair(search_attributes.OUTBOX_NAME, item.outbox),
            SearchAttributePair(search_attributes.OUTBOX_STATUS, ItemStatus.QUEUED.value),
            SearchAttributePair(search_attributes.DESTINATION, item.destination),
        ]
        if item.ordering_key is not None:
            pairs.append(SearchAttributePair(search_attributes.ORDERING_KEY, item.ordering_key))
        start_delay = None
        if item.not_before is not None and item.not_before > datetime.now(UTC):
            start_delay = item.not_before - datetime.now(UTC)
        await self.client.start_workflow(
            OutboxItemWorkflow.run,
            item,
            id=item_workflow_id(item.outbox, item.key),
            task_queue=self.task_queue,
            id_reuse_policy=reuse,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            search_attributes=TypedSearchAttributes(pairs),
            memo={"payload_hash": item.payload_hash},
            static_summary=_summary(item),
            start_delay=start_delay,
            rpc_timeout=RPC_TIMEOUT,
        )

    async def _check_existing(self, item_id: str, fingerprint: str) -> None:
        description = await self.client.get_workflow_handle(item_id).describe(
            rpc_timeout=RPC_TIMEOUT
        )
        existing = await description.memo_value("payload_hash", default=None)
        if existing != fingerprint:
            raise IdempotencyConflict(
                "this Idempotency-Key is already used by an item with a different destination,"
                " payload or ordering key"
            )
        if description.status in _FAILED_STATES:
            raise ItemFailedUseRedrive(
                "the item with this Idempotency-Key failed permanently; redrive it to try again"
            )

    def _handle(self, outbox: str, key: str) -> WorkflowHandle[Any, OutboxItemView]:
        _validate(outbox, key)
        return self.client.get_workflow_handle_for(
            OutboxItemWorkflow.run, item_workflow_id(outbox, key)
        )

    async def _describe(self, handle: WorkflowHandle[Any, OutboxItemView]) -> Any:
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
                converter = self.client.data_converter or DataConverter.default
                decoded = await converter.decode(payloads, [OutboxItemInput])
                item: OutboxItemInput = decoded[0]
                # The first run's input; a continued-as-new run's state is not wanted here.
                return replace(item, state=None)
        raise ItemNotFound(f"no start event for {handle.id!r}")


def _validate(outbox: str, key: str) -> None:
    validate_outbox(outbox)
    validate_key(key)


def validate_outbox(outbox: str) -> None:
    """Raise InvalidRequest unless `outbox` is a valid outbox name."""
    if not _OUTBOX_NAME.match(outbox):
        raise InvalidRequest(
            f"outbox name must be 1-{MAX_OUTBOX_LENGTH} letters, digits, '.', '_' or '-',"
            " starting with a letter or digit"
        )


def validate_key(key: str) -> None:
    """Raise InvalidRequest unless `key` is a valid idempotency key."""
    _validate_text(key, "idempotency key")
    # The key is the last segment of the item's URL: "." and ".." would make that path climb a
    # level once any client normalises it.
    if key in (".", ".."):
        raise InvalidRequest(f"idempotency key {key!r} cannot be addressed in a URL path")


def _validate_text(value: str, what: str) -> None:
    # isprintable() also refuses lone surrogates, which no UTF-8 workflow id can carry.
    if not _KEY.match(value) or not value.isprintable():
        raise InvalidRequest(
            f"{what} must be 1-{MAX_KEY_LENGTH} printable characters other than '/'"
        )


def _pending_view(item_id: str, item: OutboxItemInput, description: Any) -> OutboxItemView:
    starts_at = description.execution_time or item.not_before
    return OutboxItemView(
        id=item_id,
        outbox=item.outbox,
        key=item.key,
        destination=item.destination,
        status=ItemStatus.QUEUED,
        attempts=0,
        max_attempts=item.policy.max_attempts,
        last_error=None,
        next_attempt_at=starts_at,
        operation_url=None,
        poll_count=0,
        created_at=item.enqueued_at,
        updated_at=item.enqueued_at,
        finished_at=None,
        ordering_key=item.ordering_key,
        payload_hash=item.payload_hash,
    )


def _summary(item: OutboxItemInput) -> str:
    recipient = ""
    recipients = item.payload.get("recipients")
    if isinstance(recipients, dict) and recipients.get("to"):
        first = recipients["to"][0]
        if isinstance(first, dict) and "address" in first:
            recipient = f" to {first['address']}"
    return f"Outbox {item.outbox}: deliver{recipient} via {item.destination} (key {item.key})"
