"""Item-mode lanes: every item of an ordering key held by the lane's own workflow.

Appends go as `append_items` updates with start, a batch per lane at a time from each process
(`durable_outbox_temporal.mailbox`), so twenty appenders in one process cost one update in flight,
well within Temporal's ten per workflow, and each append is confirmed by the update's answer without
a query.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio.client import (
    Client,
    RPCTimeoutOrCancelledError,
    WithStartWorkflowOperation,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.service import RPCError, RPCStatusCode

from durable_outbox_temporal import lanes
from durable_outbox_temporal.contract import search_attributes
from durable_outbox_temporal.contract.bulk import ShardInput, admit_per_task
from durable_outbox_temporal.contract.ids import lane_workflow_id
from durable_outbox_temporal.contract.item import ItemStatus, OutboxItemInput, OutboxItemView
from durable_outbox_temporal.contract.lane import (
    APPEND_SIGNAL,
    APPEND_UPDATE,
    LANE_WORKFLOW_TYPE,
    MAX_APPEND_BATCH,
    AppendOutcome,
    LaneAppends,
    LaneAppendsResult,
    LaneState,
    LaneStatus,
    RemoveRequest,
)
from durable_outbox_temporal.destinations import OutboxSettings
from durable_outbox_temporal.errors import CannotCancel, check_same_request
from durable_outbox_temporal.mailbox import Mailbox
from durable_outbox_temporal.placement import (
    RPC_TIMEOUT,
    CancelRequested,
    HostedItems,
    ItemRef,
    outcomes_of,
)
from durable_outbox_temporal.updates import update_with_start

# How long an append waits for a worker to take it; without one it is recorded by signal.
APPEND_CONFIRM_WAIT = timedelta(seconds=5)
# A batch's items as JSON, at most: well under Temporal's 2 MB payload limit.
MAX_APPEND_BYTES = 512 * 1024


class ItemLanes(HostedItems):
    """Items with an ordering key on an item-mode destination, held by their lane's workflow."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._appender = LaneAppender(self._temporal, self._task_queue)

    def holder(self, item: ItemRef) -> str:
        assert item.ordering_key is not None, "an item of a lane has an ordering key"
        return lane_workflow_id(item.outbox, item.ordering_key)

    async def lane_holder(self, outbox: str, ordering_key: str, destination: str | None) -> str:
        return lane_workflow_id(outbox, ordering_key)

    async def hand_over(self, items: Sequence[OutboxItemInput]) -> list[bool | Exception]:
        """Append each to its lane. The appends start in the given order and each lane's
        mailbox queues them as they come, so a lane gets them in that order."""
        outcomes = await asyncio.gather(
            *(self._append(item) for item in items), return_exceptions=True
        )
        return outcomes_of(outcomes)

    async def _append(self, item: OutboxItemInput) -> bool:
        """Whether this call added the item (False: it was there). Raises
        `IdempotencyConflict` or `LaneFull`."""
        assert item.ordering_key is not None
        destination = self.destinations.get(item.destination)
        outcome = await self._appender.append(
            item,
            self.destinations.outbox(item.outbox),
            destination.lane_run if destination is not None else 1,
        )
        if outcome is AppendOutcome.CONFLICT:
            check_same_request(None, item.payload_hash)
        if outcome is AppendOutcome.FULL:
            raise lanes.lane_full(item.outbox, item.ordering_key)
        return outcome is not AppendOutcome.DUPLICATE

    async def cancel(
        self, item: ItemRef, reason: str, wait: timedelta
    ) -> OutboxItemView | CancelRequested:
        """The lane takes the item out, or cancels its head if the provider does not have it
        yet; with no worker answering in time, the lane acts on a signal when one returns."""
        assert item.ordering_key is not None
        client = await self._temporal()
        holder = self.holder(item)
        request = RemoveRequest(
            key=item.key, reason=reason, outbox=item.outbox, ordering_key=item.ordering_key
        )
        try:
            removed = await lanes.remove(client, holder, request, wait=wait)
        except WorkflowUpdateRPCTimeoutOrCancelledError:
            # No worker answered: the lane acts on the signal when one returns.
            requested = await self.signal_cancel(item, reason)
            if requested is None:
                raise CannotCancel("the item is no longer waiting in its lane") from None
            return requested
        for taken in removed.views:
            if taken.key == item.key:
                return taken
        if removed.head is not None:
            if removed.head.status is ItemStatus.QUEUED:
                raise CannotCancel("the item is being submitted now; it can no longer be cancelled")
            raise CannotCancel(
                f"item is {removed.head.status.value}; only queued items can be cancelled"
            )
        raise CannotCancel("the item is no longer waiting in its lane")

    async def purge(
        self, outbox: str, destination: str | None, reason: str, wait: timedelta
    ) -> list[str]:
        """Take every item waiting in the outbox's lanes out (optionally of one destination);
        the keys taken. Items running at a lane's head are the item purge's to cancel."""
        client = await self._temporal()
        removed: list[str] = []
        request = RemoveRequest(destination=destination, reason=reason, outbox=outbox)
        for ordering_key in await lanes.running_lanes(client, outbox, rpc_timeout=RPC_TIMEOUT):
            holder = lane_workflow_id(outbox, ordering_key)
            result = await lanes.remove(client, holder, request, wait=wait)
            removed.extend(result.removed)
        return removed


@dataclass(frozen=True)
class _Append:
    item: OutboxItemInput
    settings: OutboxSettings
    lane_run: int = 1


def _append_bytes(append: _Append) -> int:
    return len(append.item.key) + len(json.dumps(append.item.payload, default=str))


class LaneAppender:
    """Appends items to item-mode lanes: per lane, one `append_items` update in flight from
    this process, carrying every append that arrived meanwhile (in arrival order)."""

    def __init__(self, temporal: Callable[[], Awaitable[Client]], task_queue: str) -> None:
        self._temporal = temporal
        self._task_queue = task_queue
        self._mailbox: Mailbox[_Append, AppendOutcome] = Mailbox(
            self._send, max_batch=MAX_APPEND_BATCH, size=_append_bytes, max_size=MAX_APPEND_BYTES
        )

    async def append(
        self, item: OutboxItemInput, settings: OutboxSettings, lane_run: int = 1
    ) -> AppendOutcome:
        """What the lane did with the item; `UNKNOWN` when no worker took it in time (it is
        recorded by the server all the same, and the lane takes it when a worker returns)."""
        assert item.ordering_key is not None
        lane_id = lane_workflow_id(item.outbox, item.ordering_key)
        return await self._mailbox.call(lane_id, _Append(item, settings, lane_run))

    async def _send(self, lane_id: str, appends: list[_Append]) -> list[AppendOutcome]:
        first = appends[0]
        client = await self._temporal()
        batch = LaneAppends(
            items=[append.item for append in appends],
            policy=first.settings.lane_policy,
            lane_runs={append.item.destination: append.lane_run for append in appends},
        )
        start_input, options = self._start(first.item, first.settings)
        try:
            result = await update_with_start(
                client,
                APPEND_UPDATE,
                batch,
                start=lambda: WithStartWorkflowOperation(
                    LANE_WORKFLOW_TYPE,
                    start_input,
                    id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                    **options,
                ),
                result_type=LaneAppendsResult,
                rpc_timeout=APPEND_CONFIRM_WAIT,
            )
        except Exception as err:
            if not _no_answer(err):
                raise
            # No worker took the update in time (an outage): the same batch as a signal is
            # recorded by the server, and the lane takes it (or finds it there) later.
            await lanes.signal_with_start(
                client,
                LANE_WORKFLOW_TYPE,
                start_input,
                start_signal=APPEND_SIGNAL,
                start_signal_args=[batch],
                rpc_timeout=APPEND_CONFIRM_WAIT,
                **options,
            )
            return [AppendOutcome.UNKNOWN] * len(appends)
        return result.outcomes

    def _start(
        self, item: OutboxItemInput, settings: OutboxSettings
    ) -> tuple[ShardInput, dict[str, Any]]:
        assert item.ordering_key is not None
        lane = LaneState(
            outbox=item.outbox, ordering_key=item.ordering_key, policy=settings.lane_policy
        )
        start_input = ShardInput(
            destination="",
            shard=0,
            lanes=[lane],
            linger_s=settings.lane_idle_s,
            continue_after_events=settings.lane_history_events,
            admit_per_task=admit_per_task(),
        )
        options: dict[str, Any] = {
            "id": lane_workflow_id(item.outbox, item.ordering_key),
            "task_queue": self._task_queue,
            # A lane that ended when idle starts again; one that failed (a bug) too.
            "id_reuse_policy": WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            "search_attributes": TypedSearchAttributes(
                [
                    SearchAttributePair(search_attributes.OUTBOX_NAME, item.outbox),
                    SearchAttributePair(search_attributes.ORDERING_KEY, item.ordering_key),
                    SearchAttributePair(search_attributes.LANE_STATE, LaneStatus.RUNNING.value),
                ]
            ),
            "static_summary": f"Outbox {item.outbox}: ordering lane {item.ordering_key}",
        }
        return start_input, options


def _no_answer(err: BaseException) -> bool:
    """No worker answered in time, as opposed to a refusal or an outage."""
    if isinstance(err, (RPCTimeoutOrCancelledError, WorkflowUpdateRPCTimeoutOrCancelledError)):
        return True
    return isinstance(err, RPCError) and err.status in (
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.CANCELLED,
    )
