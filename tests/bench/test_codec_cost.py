"""The encryption-cost figure walks every payload of a history event, maps and lists included."""

from __future__ import annotations

from temporalio.api.common.v1 import Header, Payload, Payloads
from temporalio.api.history.v1 import HistoryEvent, WorkflowExecutionStartedEventAttributes

from bench.codec_cost import payloads_in


def test_every_payload_of_an_event_is_found() -> None:
    started = WorkflowExecutionStartedEventAttributes(
        input=Payloads(payloads=[Payload(data=b"first"), Payload(data=b"second")]),
        header=Header(fields={"trace": Payload(data=b"header")}),
    )
    event = HistoryEvent(event_id=1, workflow_execution_started_event_attributes=started)

    assert sorted(p.data for p in payloads_in(event)) == [b"first", b"header", b"second"]
