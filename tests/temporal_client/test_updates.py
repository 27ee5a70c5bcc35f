"""Which refusals of an update-with-start mean "nothing was applied, send it again"."""

from __future__ import annotations

import asyncio
import gc
from datetime import timedelta
from typing import Any

from durable_outbox_temporal.updates import not_ready, update_with_start
from google.protobuf.any_pb2 import Any as AnyProto
from google.rpc.status_pb2 import Status
from temporalio.api.enums.v1 import ResourceExhaustedCause
from temporalio.api.errordetails.v1 import (
    MultiOperationExecutionFailure,
    ResourceExhaustedFailure,
    WorkflowNotReadyFailure,
)
from temporalio.client import WithStartWorkflowOperation
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode


def refusal(
    status: RPCStatusCode, *details: object, wrapped: bool = False, message: str = "refused"
) -> RPCError:
    """An RPC error as the server sends it, its details packed; `wrapped`: inside the
    multi-operation failure an update-with-start answers with (the message too)."""
    packed = []
    for detail in details:
        holder = AnyProto()
        holder.Pack(detail)  # type: ignore[arg-type]
        packed.append(holder)
    if wrapped:
        failure = MultiOperationExecutionFailure(
            statuses=[
                MultiOperationExecutionFailure.OperationStatus(
                    code=int(status), message=message, details=packed
                )
            ]
        )
        outer = AnyProto()
        outer.Pack(failure)
        packed = [outer]
        message = "MultiOperation could not be executed"
    grpc_status = Status(code=int(status), message=message, details=packed)
    return RPCError(message, status, grpc_status.SerializeToString())


def test_an_aborted_or_closing_workflow_is_not_ready() -> None:
    closing = ResourceExhaustedFailure(
        cause=ResourceExhaustedCause.RESOURCE_EXHAUSTED_CAUSE_BUSY_WORKFLOW
    )
    for wrapped in (False, True):
        not_yet = WorkflowNotReadyFailure()
        assert not_ready(refusal(RPCStatusCode.FAILED_PRECONDITION, not_yet, wrapped=wrapped))
        assert not_ready(refusal(RPCStatusCode.RESOURCE_EXHAUSTED, closing, wrapped=wrapped))
        # The run ended (an idle aggregate's) while the update waited to be taken.
        ended = "workflow execution already completed"
        assert not_ready(refusal(RPCStatusCode.NOT_FOUND, wrapped=wrapped, message=ended))


def test_other_refusals_are_not_sent_again() -> None:
    # A namespace over its rate limit: the SDK's own retries and the caller's 503 deal with it.
    throttled = ResourceExhaustedFailure(
        cause=ResourceExhaustedCause.RESOURCE_EXHAUSTED_CAUSE_RPS_LIMIT
    )
    assert not not_ready(refusal(RPCStatusCode.RESOURCE_EXHAUSTED, throttled))
    assert not not_ready(refusal(RPCStatusCode.RESOURCE_EXHAUSTED))
    assert not not_ready(refusal(RPCStatusCode.FAILED_PRECONDITION))
    assert not not_ready(refusal(RPCStatusCode.INVALID_ARGUMENT, WorkflowNotReadyFailure()))
    assert not not_ready(refusal(RPCStatusCode.NOT_FOUND, message="workflow not found"))


async def test_a_failed_call_leaves_no_unread_error_for_asyncio_to_log() -> None:
    """The SDK hands the call's error to the start operation too (`_on_start_error`): read
    there, asyncio has nothing to log as "Future exception was never retrieved"."""
    loop = asyncio.get_running_loop()
    logged: list[str] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: logged.append(str(context["message"])))

    class TimingOut:
        async def execute_update_with_start_workflow(
            self, *_args: object, start_workflow_operation: Any, **_kwargs: object
        ) -> None:
            timeout = refusal(RPCStatusCode.DEADLINE_EXCEEDED)
            start_workflow_operation._workflow_handle.set_exception(timeout)
            raise timeout

    def start() -> WithStartWorkflowOperation[Any, Any]:
        return WithStartWorkflowOperation(
            "Anything",
            id="w",
            task_queue="q",
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )

    async def call() -> str:
        try:
            await update_with_start(
                TimingOut(),  # type: ignore[arg-type]
                "u",
                None,
                start=start,
                result_type=type(None),
                rpc_timeout=timedelta(seconds=1),
            )
        except RPCError as err:
            return err.message
        return "answered"

    try:
        # The error (and the frames that hold the operation) gone, the future is collected.
        assert await call() == "refused"
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert logged == []
