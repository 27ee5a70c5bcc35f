"""Which refusals of an update-with-start mean "nothing was applied, send it again"."""

from __future__ import annotations

from google.protobuf.any_pb2 import Any as AnyProto
from google.rpc.status_pb2 import Status
from temporalio.api.enums.v1 import ResourceExhaustedCause
from temporalio.api.errordetails.v1 import (
    MultiOperationExecutionFailure,
    ResourceExhaustedFailure,
    WorkflowNotReadyFailure,
)
from temporalio.service import RPCError, RPCStatusCode

from outbox_client.updates import not_ready


def refusal(status: RPCStatusCode, *details: object, wrapped: bool = False) -> RPCError:
    """An RPC error as the server sends it, its details packed; `wrapped`: inside the
    multi-operation failure an update-with-start answers with."""
    packed = []
    for detail in details:
        holder = AnyProto()
        holder.Pack(detail)  # type: ignore[arg-type]
        packed.append(holder)
    if wrapped:
        failure = MultiOperationExecutionFailure(
            statuses=[MultiOperationExecutionFailure.OperationStatus(details=packed)]
        )
        outer = AnyProto()
        outer.Pack(failure)
        packed = [outer]
    grpc_status = Status(code=int(status), message="refused", details=packed)
    return RPCError("refused", status, grpc_status.SerializeToString())


def test_an_aborted_or_closing_workflow_is_not_ready() -> None:
    closing = ResourceExhaustedFailure(
        cause=ResourceExhaustedCause.RESOURCE_EXHAUSTED_CAUSE_BUSY_WORKFLOW
    )
    for wrapped in (False, True):
        not_yet = WorkflowNotReadyFailure()
        assert not_ready(refusal(RPCStatusCode.FAILED_PRECONDITION, not_yet, wrapped=wrapped))
        assert not_ready(refusal(RPCStatusCode.RESOURCE_EXHAUSTED, closing, wrapped=wrapped))


def test_other_refusals_are_not_sent_again() -> None:
    # A namespace over its rate limit: the SDK's own retries and the caller's 503 deal with it.
    throttled = ResourceExhaustedFailure(
        cause=ResourceExhaustedCause.RESOURCE_EXHAUSTED_CAUSE_RPS_LIMIT
    )
    assert not not_ready(refusal(RPCStatusCode.RESOURCE_EXHAUSTED, throttled))
    assert not not_ready(refusal(RPCStatusCode.RESOURCE_EXHAUSTED))
    assert not not_ready(refusal(RPCStatusCode.FAILED_PRECONDITION))
    assert not not_ready(refusal(RPCStatusCode.INVALID_ARGUMENT, WorkflowNotReadyFailure()))
