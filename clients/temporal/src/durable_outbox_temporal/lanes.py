"""Ordering lanes from the client's side: inspect, remove, resume, whichever workflow holds them.

An item with an `ordering_key` is not started by the client: it is handed to its lane, which
runs it when its turn comes. In item mode the lane is a workflow of its own
(`lane/{outbox}/{ordering_key}`, `durable_outbox_temporal.item_lanes`); in bulk mode the
destination's shard that owns the key holds the lane (`durable_outbox_temporal.shards`). Both answer
the calls here.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio.client import (
    Client,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
)
from temporalio.common import (
    QueryRejectCondition,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from durable_outbox_temporal.contract import search_attributes
from durable_outbox_temporal.contract.ids import lane_workflow_id
from durable_outbox_temporal.contract.item import DeliveryPolicy
from durable_outbox_temporal.contract.lane import (
    LANE_ENTRY_BYTES,
    LANE_MAX_WAITING_BYTES,
    LANE_QUERY,
    LANE_WORKFLOW_TYPE,
    REDRIVE_HEAD_SIGNAL,
    REMOVE_UPDATE,
    SKIP_HEAD_SIGNAL,
    LaneDetail,
    LaneStatus,
    LaneView,
    RedriveHead,
    RemoveRequest,
    RemoveResult,
    SkipHead,
    over_capacity,
)
from durable_outbox_temporal.errors import LaneFull, LaneNotFound, LaneNotHalted

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


def check_capacity(lane: LaneView, size: int) -> None:
    """Raise `LaneFull` if `size` more bytes would take the lane past what it may carry."""
    if lane.length and over_capacity(lane.waiting_bytes, lane.length, size):
        raise lane_full(lane.outbox, lane.ordering_key)


def lane_full(outbox: str, ordering_key: str) -> LaneFull:
    return LaneFull(
        f"lane {ordering_key!r} of outbox {outbox!r} carries as much as one lane may"
        f" ({LANE_MAX_WAITING_BYTES} bytes: keys, payloads and {LANE_ENTRY_BYTES} an item);"
        " retry once it has drained"
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
