"""Ordering lanes from the client's side: append, inspect, remove, resume.

An item with an `ordering_key` is not started by the client: it is appended to its lane, which
runs it when its turn comes. In item mode the lane is a workflow of its own
(`lane/{outbox}/{ordering_key}`): appends go as `append_items` updates with start, a batch per
lane at a time from each process (`outbox_client.mailbox`), so twenty appenders in one process
cost one update in flight, well within Temporal's ten per workflow, and each append is
confirmed by the update's answer without a query. In bulk mode the destination's shard that
owns the key holds the lane, and items reach it with the shard's enqueue signal.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio.client import (
    Client,
    RPCTimeoutOrCancelledError,
    WithStartWorkflowOperation,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import (
    QueryRejectCondition,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from common.destinations import OutboxSettings
from contract import search_attributes
from contract.bulk import ShardInput
from contract.ids import lane_workflow_id
from contract.item import DeliveryPolicy, OutboxItemInput
from contract.lane import (
    APPEND_SIGNAL,
    APPEND_UPDATE,
    LANE_MAX_WAITING_BYTES,
    LANE_QUERY,
    LANE_WORKFLOW_TYPE,
    MAX_APPEND_BATCH,
    REDRIVE_HEAD_SIGNAL,
    REMOVE_UPDATE,
    SKIP_HEAD_SIGNAL,
    AppendOutcome,
    LaneAppends,
    LaneAppendsResult,
    LaneDetail,
    LaneState,
    LaneStatus,
    LaneView,
    RedriveHead,
    RemoveRequest,
    RemoveResult,
    SkipHead,
)
from outbox_client.errors import LaneFull, LaneNotFound, LaneNotHalted
from outbox_client.mailbox import Mailbox
from outbox_client.updates import update_with_start

# How long an append waits for a worker to take it; without one it is recorded by signal.
APPEND_CONFIRM_WAIT = timedelta(seconds=5)
# A batch's items as JSON, at most: well under Temporal's 2 MB payload limit.
MAX_APPEND_BYTES = 512 * 1024
# Signal-with-start is atomic on a real server; a racing start elsewhere is retried this often.
_SIGNAL_WITH_START_ATTEMPTS = 3
# A lane query is answered by a worker; an idle cluster answers in milliseconds.
LANE_QUERY_WAIT = timedelta(seconds=5)


async def signal_with_start(client: Client, workflow: str, arg: Any, **options: Any) -> None:
    """`start_workflow` with a start signal: signals the workflow, starting it if it is not
    running. Two racing starts of a workflow that was not running can still meet
    `WorkflowAlreadyStartedError` (seen on the time-skipping server); the failed call recorded
    nothing, so it is sent again."""
    for attempt in range(_SIGNAL_WITH_START_ATTEMPTS):
        try:
            await client.start_workflow(workflow, arg, **options)
            return
        except WorkflowAlreadyStartedError:
            if attempt + 1 == _SIGNAL_WITH_START_ATTEMPTS:
                raise


@dataclass(frozen=True)
class _Append:
    item: OutboxItemInput
    settings: OutboxSettings


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

    async def append(self, item: OutboxItemInput, settings: OutboxSettings) -> AppendOutcome:
        """What the lane did with the item; `UNKNOWN` when no worker took it in time (it is
        recorded by the server all the same, and the lane takes it when a worker returns)."""
        assert item.ordering_key is not None
        lane_id = lane_workflow_id(item.outbox, item.ordering_key)
        return await self._mailbox.call(lane_id, _Append(item, settings))

    async def _send(self, lane_id: str, appends: list[_Append]) -> list[AppendOutcome]:
        first = appends[0]
        client = await self._temporal()
        batch = LaneAppends(
            items=[append.item for append in appends], policy=first.settings.lane_policy
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
            await signal_with_start(
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


def check_capacity(lane: LaneView, size: int) -> None:
    """Raise `LaneFull` if `size` more bytes would take the lane past what it may carry."""
    if lane.length and lane.waiting_bytes + size > LANE_MAX_WAITING_BYTES:
        raise lane_full(lane.outbox, lane.ordering_key)


def lane_full(outbox: str, ordering_key: str) -> LaneFull:
    return LaneFull(
        f"lane {ordering_key!r} of outbox {outbox!r} carries as much as one lane may"
        f" ({LANE_MAX_WAITING_BYTES} bytes of keys and payloads); retry once it has drained"
    )


async def detail(client: Client, holder: str, outbox: str, ordering_key: str) -> LaneDetail | None:
    """A running lane's live detail from the workflow holding it; None if it holds no such
    lane (the lane ended idle, or never ran)."""
    handle = client.get_workflow_handle(holder)
    try:
        lane: LaneDetail | None = await handle.query(
            LANE_QUERY,
            lane_workflow_id(outbox, ordering_key),
            result_type=LaneDetail,
            reject_condition=QueryRejectCondition.NOT_OPEN,
            rpc_timeout=LANE_QUERY_WAIT,
        )
    except (WorkflowQueryRejectedError, WorkflowQueryFailedError):
        return None
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    return lane


async def remove(
    client: Client, holder: str, request: RemoveRequest, *, wait: timedelta
) -> RemoveResult:
    """Cancel waiting items of the lanes `request` names in the running workflow `holder`; an
    empty result if it is not running."""
    handle = client.get_workflow_handle(holder)
    try:
        result: RemoveResult = await handle.execute_update(
            REMOVE_UPDATE, request, result_type=RemoveResult, rpc_timeout=wait
        )
    except RPCError as err:
        # Not running (ended idle, or never ran): nothing is waiting in it.
        if err.status == RPCStatusCode.NOT_FOUND:
            return RemoveResult()
        raise
    return result


async def running_lanes(client: Client, outbox: str, *, rpc_timeout: timedelta) -> list[str]:
    """Ordering keys of the outbox's running item-mode lanes, from visibility (it trails by a
    moment)."""
    query = (
        f"WorkflowType = '{LANE_WORKFLOW_TYPE}' AND ExecutionStatus = 'Running'"
        f" AND {search_attributes.OUTBOX_NAME.name} = '{outbox}'"
    )
    keys = []
    async for execution in client.list_workflows(query, rpc_timeout=rpc_timeout):
        _, _, ordering_key = execution.id.partition("/")[2].partition("/")
        keys.append(ordering_key)
    return keys


async def resume(
    client: Client,
    holder: str,
    outbox: str,
    ordering_key: str,
    *,
    redrive_policy: DeliveryPolicy | None = None,
    last_event_seq: int = 0,
    skip_reason: str | None = None,
    rpc_timeout: timedelta,
) -> str:
    """Resume a halted lane: redrive its failed head item, or skip it; returns the head's key.

    Raises `LaneNotFound` or `LaneNotHalted`."""
    current = await detail(client, holder, outbox, ordering_key)
    if current is None:
        raise LaneNotFound(f"no running lane {ordering_key!r} in outbox {outbox!r}")
    head = current.view.head_key
    if current.view.status is not LaneStatus.HALTED or head is None:
        raise LaneNotHalted(
            f"lane {ordering_key!r} is {current.view.status.value}; only a halted lane's head"
            " item can be redriven or skipped"
        )
    handle = client.get_workflow_handle(holder)
    signal: tuple[str, Any]
    if skip_reason is not None:
        signal = (
            SKIP_HEAD_SIGNAL,
            SkipHead(key=head, reason=skip_reason, ordering_key=ordering_key),
        )
    else:
        redrive = RedriveHead(
            key=head,
            ordering_key=ordering_key,
            policy=redrive_policy,
            last_event_seq=last_event_seq,
        )
        signal = (REDRIVE_HEAD_SIGNAL, redrive)
    await handle.signal(signal[0], signal[1], rpc_timeout=rpc_timeout)
    return head
