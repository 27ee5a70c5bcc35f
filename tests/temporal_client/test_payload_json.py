"""The product's JSON payload converter writes exactly what the SDK's default writes and reads
it back into the same objects, for every shape the contract sends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from durable_outbox_temporal import payload_json
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


@pytest.mark.parametrize("value,kind", samples(), ids=lambda v: type(v).__name__)
def test_the_contract_is_read_without_the_sdks_reading_of_each_value(
    value: Any, kind: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each type hint is read by a reader compiled once: the SDK's `value_to_type` (which works
    out what a hint is for every value) reads none of the contract's (a bulk shard's next run
    spent most of its first workflow task in it: docs/decisions/payload-json.md)."""
    ours = data_converter(None).payload_converter
    [written] = ours.to_payloads([value])
    asked: list[Any] = []
    sdks = payload_json.value_to_type

    def counted(hint: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append(hint)
        return sdks(hint, *args, **kwargs)

    monkeypatch.setattr(payload_json, "value_to_type", counted)

    [read] = ours.from_payloads([written], [kind])

    assert read == value
    assert asked == []


@pytest.mark.parametrize(
    "raw,kind",
    [
        ({"outbox": "o", "key": 1}, ItemEvent),  # a number for a string
        ({"seq": 1, "type": "no-such-type", "status": "queued", "at": NOW.isoformat()}, ItemEvent),
        ({"seq": 1, "type": "enqueued", "status": "queued", "at": "not a time"}, ItemEvent),
        ({"seq": True, "type": "enqueued", "status": "queued", "at": NOW.isoformat()}, ItemEvent),
        ({"delivered": False, "recipients": "ab"}, SubmitResult),  # a string is iterable
        ({"delivered": False, "recipients": 3}, SubmitResult),
        ({"delivered": False, "retry_after_s": "soon"}, SubmitResult),
        ({"delivered": False, "retry_after_s": None, "projected_seq": 2.0}, SubmitResult),
    ],
)
def test_odd_values_read_or_fail_as_with_the_sdks_default(raw: Any, kind: type) -> None:
    ours = data_converter(None).payload_converter
    default = DataConverter.default.payload_converter
    [payload] = default.to_payloads([raw])
    try:
        expected = default.from_payloads([payload], [kind])[0]
    except Exception as err:  # noqa: BLE001 - the SDK's refusal is what ours must match
        with pytest.raises(type(err)) as refused:
            ours.from_payloads([payload], [kind])
        assert _causes(refused.value) == _causes(err)
    else:
        assert ours.from_payloads([payload], [kind])[0] == expected


def _causes(err: BaseException | None) -> list[str]:
    """The chain of messages from an error down to its first cause."""
    found = []
    while err is not None:
        found.append(str(err))
        err = err.__cause__
    return found
