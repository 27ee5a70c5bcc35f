"""Update-with-start that goes again when the server aborted it before the workflow took it.

An aggregate's command batch and a lane's append batch are both updates that start their
workflow if it is not running. At a hand-over to the next run (continue-as-new), or when the
workflow task the update went out with failed, the server answers FAILED_PRECONDITION with
`WorkflowNotReadyFailure`; while the run is closing (its last task completed, the next run not
yet started), RESOURCE_EXHAUSTED with the cause `BUSY_WORKFLOW`; when the run ended while the
update waited to be taken (an idle aggregate's run ends: passivation), NOT_FOUND "workflow
execution already completed". Each time nothing was applied, and the same update may go again
(after an end, it starts the next run).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio.api.enums.v1 import ResourceExhaustedCause
from temporalio.api.errordetails.v1 import (
    MultiOperationExecutionFailure,
    ResourceExhaustedFailure,
    WorkflowNotReadyFailure,
)
from temporalio.client import Client, WithStartWorkflowOperation
from temporalio.service import RPCError, RPCStatusCode

Result = TypeVar("Result")
# How often an update goes again when the server aborted it before the workflow took it.
NOT_READY_RETRIES = 5


async def update_with_start(
    client: Client,
    update: str,
    arg: Any,
    *,
    start: Callable[[], WithStartWorkflowOperation[Any, Any]],
    result_type: type[Result],
    rpc_timeout: timedelta,
) -> Result:
    """Run `update` on the workflow `start()` describes, starting it if it is not running.

    `start` makes a fresh operation per attempt (an operation is used once)."""
    for attempt in range(NOT_READY_RETRIES + 1):
        operation = start()
        try:
            result: Result = await client.execute_update_with_start_workflow(
                update,
                arg,
                start_workflow_operation=operation,
                result_type=result_type,
                rpc_timeout=rpc_timeout,
            )
        except RPCError as err:
            _read_start_error(operation)
            if not not_ready(err) or attempt == NOT_READY_RETRIES:
                raise
            await asyncio.sleep(0.05 * 2**attempt)
            continue
        except BaseException:
            _read_start_error(operation)
            raise
        return result
    raise AssertionError("unreachable: the last attempt returns or raises")


def _read_start_error(operation: WithStartWorkflowOperation[Any, Any]) -> None:
    """The SDK hands a failed call's error to its start operation's handle too, which nothing
    here awaits: read it, or asyncio logs "Future exception was never retrieved" with its
    traceback for every timed-out update (seen in the API's log during worker kills)."""
    handle = getattr(operation, "_workflow_handle", None)
    if isinstance(handle, asyncio.Future) and handle.done() and not handle.cancelled():
        handle.exception()


def not_ready(err: RPCError) -> bool:
    """The server aborted the update before the workflow took it: the workflow task it went
    out with failed or ended the run (a hand-over to the next run), or the run is closing."""
    details = list(err.grpc_status.details)
    messages = [err.message]
    for detail in err.grpc_status.details:
        # Update-with-start answers for its two operations, each with its own details.
        if detail.Is(MultiOperationExecutionFailure.DESCRIPTOR):
            failure = MultiOperationExecutionFailure()
            detail.Unpack(failure)
            details += [inner for status in failure.statuses for inner in status.details]
            messages += [status.message for status in failure.statuses]
    if err.status == RPCStatusCode.NOT_FOUND:
        return any(ended(message) for message in messages)
    if err.status == RPCStatusCode.FAILED_PRECONDITION:
        return any(detail.Is(WorkflowNotReadyFailure.DESCRIPTOR) for detail in details)
    if err.status == RPCStatusCode.RESOURCE_EXHAUSTED:
        return any(_busy_workflow(detail) for detail in details)
    return False


def ended(message: str) -> bool:
    """Whether NOT_FOUND says the run ended (rather than that no workflow has the id)."""
    return "already completed" in message.lower()


def _busy_workflow(detail: Any) -> bool:
    if not detail.Is(ResourceExhaustedFailure.DESCRIPTOR):
        return False
    failure = ResourceExhaustedFailure()
    detail.Unpack(failure)
    return failure.cause == ResourceExhaustedCause.RESOURCE_EXHAUSTED_CAUSE_BUSY_WORKFLOW
