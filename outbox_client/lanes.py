"""Ordering lanes from the client's side: append by signal-with-start, inspect, remove, resume.

An item with an `ordering_key` is not started by the client: it is appended to its lane
(`lane/{outbox}/{ordering_key}`), which starts it as a child when its turn comes. The append is
a signal-with-start, so the server serialises appends from any number of processes into the
lane's history, and a lane that has ended is started again by the next append.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from temporalio.client import (
    Client,
    RPCTimeoutOrCancelledError,
    WorkflowHandle,
    WorkflowQueryRejectedError,
)
from temporalio.common import (
    QueryRejectCondition,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from common.destinations import OutboxSettings
from contract import search_attributes
from contract.ids import lane_workflow_id
from contract.item import DeliveryPolicy, OutboxItemInput
from contract.lane import (
    APPEND_OUTCOME_QUERY,
    APPEND_SIGNAL,
    LANE_MAX_WAITING_BYTES,
    LANE_QUERY,
    LANE_WORKFLOW_TYPE,
    REDRIVE_HEAD_SIGNAL,
    REMOVE_UPDATE,
    SKIP_HEAD_SIGNAL,
    AppendOutcome,
    LaneAppend,
    LaneDetail,
    LaneState,
    LaneStatus,
    LaneView,
    RedriveHead,
    RemoveRequest,
    RemoveResult,
    SkipHead,
    entry_size,
)
from outbox_client.errors import LaneFull, LaneNotFound, LaneNotHalted

# How long an append waits for the lane to say what it did with it (duplicate? conflict?).
# Without a worker nobody answers; the item is in the lane's history by then all the same.
APPEND_CONFIRM_WAIT = timedelta(seconds=5)
# Signal-with-start is atomic on a real server; a racing start elsewhere is retried this often.
_SIGNAL_WITH_START_ATTEMPTS = 3
# How often a `pending` append is asked about again, and how often one the lane lost is resent.
_CONFIRM_POLL_S = 0.02
_RESENDS = 3


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


# A lane query is answered by a worker; an idle cluster answers in milliseconds.
LANE_QUERY_WAIT = timedelta(seconds=5)


async def append(
    client: Client,
    task_queue: str,
    item: OutboxItemInput,
    settings: OutboxSettings,
    *,
    rpc_timeout: timedelta,
) -> AppendOutcome:
    """Append `item` to its lane (starting the lane if it is not running); the lane's outcome,
    or `UNKNOWN` when no worker confirmed it in time (the append is recorded either way).

    Raises `LaneFull` when the lane already carries `LANE_MAX_WAITING_BYTES` of waiting items.
    """
    assert item.ordering_key is not None
    lane_id = lane_workflow_id(item.outbox, item.ordering_key)
    try:
        current = await detail(client, item.outbox, item.ordering_key)
        confirm = True
    except Exception as err:
        if not _no_answer(err):
            raise
        # No worker answers queries (an outage): the append is still recorded, unchecked.
        current, confirm = None, False
    size = entry_size(item.key, item.payload)
    if current is not None:
        check_capacity(current.view, size)
    append_id = str(uuid.uuid4())
    state = LaneState(
        outbox=item.outbox,
        ordering_key=item.ordering_key,
        policy=settings.lane_policy,
        idle_s=settings.lane_idle_s,
        continue_after_events=settings.lane_history_events,
    )
    append = LaneAppend(item=item, append_id=append_id, policy=settings.lane_policy)

    async def send() -> None:
        await signal_with_start(
            client,
            LANE_WORKFLOW_TYPE,
            state,
            id=lane_id,
            task_queue=task_queue,
            start_signal=APPEND_SIGNAL,
            start_signal_args=[append],
            # A lane that ended when idle starts again; one that failed (a bug) too.
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(search_attributes.OUTBOX_NAME, item.outbox),
                    SearchAttributePair(search_attributes.ORDERING_KEY, item.ordering_key),
                    SearchAttributePair(search_attributes.LANE_STATE, LaneStatus.RUNNING.value),
                ]
            ),
            static_summary=f"Outbox {item.outbox}: ordering lane {item.ordering_key}",
            rpc_timeout=rpc_timeout,
        )

    await send()
    if not confirm:
        return AppendOutcome.UNKNOWN
    return await _confirm(client.get_workflow_handle(lane_id), append_id, send)


async def _confirm(
    handle: WorkflowHandle[Any, Any], append_id: str, send: Callable[[], Awaitable[None]]
) -> AppendOutcome:
    """The append's outcome once the lane has recorded it: `pending` is asked again, and an
    append the lane does not know after it was sent (left behind by a continue-as-new, see
    the lane's `append_outcome`) is sent again; a run that had handled it keeps its first
    outcome.
    `UNKNOWN` if no worker confirms within `APPEND_CONFIRM_WAIT`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + APPEND_CONFIRM_WAIT.total_seconds()
    resends = 0
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            return AppendOutcome.UNKNOWN
        try:
            outcome: AppendOutcome = await handle.query(
                APPEND_OUTCOME_QUERY,
                append_id,
                result_type=AppendOutcome,
                rpc_timeout=timedelta(seconds=remaining),
            )
        except Exception as err:
            if not _no_answer(err):
                raise
            return AppendOutcome.UNKNOWN
        if outcome is AppendOutcome.PENDING:
            await asyncio.sleep(_CONFIRM_POLL_S)
        elif outcome is AppendOutcome.UNKNOWN and resends < _RESENDS:
            resends += 1
            await send()
        else:
            return outcome


def check_capacity(lane: LaneView, size: int) -> None:
    """Raise `LaneFull` if `size` more bytes would take the lane past what it may carry."""
    if lane.waiting_bytes + size > LANE_MAX_WAITING_BYTES:
        raise LaneFull(
            f"lane {lane.ordering_key!r} of outbox {lane.outbox!r} holds {lane.length} items"
            f" ({lane.waiting_bytes} bytes of keys and payloads), the most one lane carries;"
            " retry once it has drained"
        )


def _no_answer(err: BaseException) -> bool:
    """A query nobody answered in time (no worker), as opposed to a refusal or an outage."""
    if isinstance(err, RPCTimeoutOrCancelledError):
        return True
    # RESOURCE_EXHAUSTED: the server buffers only a few queries per workflow ("consistent
    # query buffer is full" under many concurrent appends); the append stands regardless.
    return isinstance(err, RPCError) and err.status in (
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.CANCELLED,
        RPCStatusCode.RESOURCE_EXHAUSTED,
    )


async def detail(client: Client, outbox: str, ordering_key: str) -> LaneDetail | None:
    """The running lane's live detail; None if it is not running (ended idle, or never ran)."""
    handle = client.get_workflow_handle(lane_workflow_id(outbox, ordering_key))
    try:
        lane: LaneDetail = await handle.query(
            LANE_QUERY,
            result_type=LaneDetail,
            reject_condition=QueryRejectCondition.NOT_OPEN,
            rpc_timeout=LANE_QUERY_WAIT,
        )
    except WorkflowQueryRejectedError:
        return None
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    return lane


async def remove(
    client: Client, outbox: str, ordering_key: str, request: RemoveRequest, *, wait: timedelta
) -> RemoveResult:
    """Cancel waiting items of a running lane; an empty result if it is not running."""
    handle = client.get_workflow_handle(lane_workflow_id(outbox, ordering_key))
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
    """Ordering keys of the outbox's running lanes, from visibility (it trails by a moment)."""
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
    current = await detail(client, outbox, ordering_key)
    if current is None:
        raise LaneNotFound(f"no running lane {ordering_key!r} in outbox {outbox!r}")
    head = current.view.head_key
    if current.view.status is not LaneStatus.HALTED or head is None:
        raise LaneNotHalted(
            f"lane {ordering_key!r} is {current.view.status.value}; only a halted lane's head"
            " item can be redriven or skipped"
        )
    handle = client.get_workflow_handle(lane_workflow_id(outbox, ordering_key))
    signal: tuple[str, Any]
    if skip_reason is not None:
        signal = (SKIP_HEAD_SIGNAL, SkipHead(key=head, reason=skip_reason))
    else:
        redrive = RedriveHead(key=head, policy=redrive_policy, last_event_seq=last_event_seq)
        signal = (REDRIVE_HEAD_SIGNAL, redrive)
    await handle.signal(signal[0], signal[1], rpc_timeout=rpc_timeout)
    return head
