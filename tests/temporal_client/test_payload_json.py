"""The product's JSON payload converter writes exactly what the SDK's default writes and reads
it back into the same objects, for every shape the contract sends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from durable_outbox_temporal.codec import data_converter
from durable_outbox_temporal.contract.bulk import ShardEnqueue
from durable_outbox_temporal.contract.flow import FlowEvent, FlowState
from durable_outbox_temporal.contract.item import (
    ItemEvent,
    ItemEventType,
    ItemStatus,
    OutboxItemInput,
    OutboxItemState,
    OutboxItemView,
    ProjectionContext,
    SubmitRequest,
    SubmitResult,
)
from durable_outbox_temporal.contract.lane import LaneAppends
from durable_outbox_temporal.destinations import Destination
from temporalio.converter import DataConverter

NOW = datetime(2026, 11, 26, 19, 0, 1, 123456, tzinfo=UTC)


def samples() -> list[tuple[Any, type]]:
    destination = Destination.model_validate(
        {"name": "hook", "provider": "webhook", "settings": {"url": "http://x"}}
    )
    item = OutboxItemInput(
        outbox="o",
        key="k",
        destination="hook",
        payload={"nested": {"list": [1, 2.5, "x", None, {"deep": True}]}, "é": "ü"},
        payload_hash="h",
        policy=destination.policy(3),
        ordering_key="lane",
        enqueued_at=NOW,
        not_before=NOW + timedelta(seconds=5),
        state=OutboxItemState(
            started=True,
            status=ItemStatus.SENDING,
            created_at=NOW,
            events=[
                ItemEvent(
                    seq=1, type=ItemEventType.ENQUEUED, status=ItemStatus.QUEUED, at=NOW, detail="d"
                )
            ],
        ),
    )
    request = SubmitRequest(
        destination="hook",
        item_id="outbox/o/k",
        idempotency_key="ik",
        payload=item.payload,
        attempt=2,
        projection=ProjectionContext(item=item, state=item.state or OutboxItemState()),
        sequence="lane#1",
    )
    flow = FlowState(
        destination="hook",
        task_queue="q",
        configured_rate=5.0,
        ramp_step_s=10.0,
        storm_window_s=30.0,
        paused_until=NOW,
        events=[FlowEvent(at=NOW, kind="throttled", detail="x", rate=None)],
    )
    return [
        (item, OutboxItemInput),
        (request, SubmitRequest),
        (SubmitResult(delivered=False, operation_url="u", recipients=["a@b"]), SubmitResult),
        (ShardEnqueue(items=[item, item], poll_batch=2), ShardEnqueue),
        (LaneAppends(items=[item]), LaneAppends),
        (OutboxItemView.of("outbox/o/k", item, item.state or OutboxItemState()), OutboxItemView),
        (flow, FlowState),
    ]


@pytest.mark.parametrize("value,kind", samples(), ids=lambda v: type(v).__name__)
def test_the_same_bytes_and_the_same_objects_as_the_sdks_default(value: Any, kind: type) -> None:
    ours = data_converter(None).payload_converter
    default = DataConverter.default.payload_converter
    [written] = ours.to_payloads([value])
    assert written == default.to_payloads([value])[0]
    [read] = ours.from_payloads([written], [kind])
    assert read == default.from_payloads([written], [kind])[0] == value


def test_refusals_match_the_sdks() -> None:
    ours = data_converter(None).payload_converter
    default = DataConverter.default.payload_converter
    for raw in ({"delivered": "yes"}, {"operation_url": "u"}, [1, 2]):
        [payload] = default.to_payloads([raw])
        with pytest.raises(Exception) as expected:
            default.from_payloads([payload], [SubmitResult])
        with pytest.raises(type(expected.value)):
            ours.from_payloads([payload], [SubmitResult])
