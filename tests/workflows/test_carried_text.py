"""A shard's carried parts, written and read by orjson (`workflows/carried_text.py`): the text
is the payload converter's own for ASCII data, reads back to equal objects whatever it holds,
and a text an older release wrote with json (NaN included) still reads."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

from durable_outbox_temporal.contract.bulk import CarriedPart
from durable_outbox_temporal.contract.item import (
    DebounceSpec,
    DeliveryPolicy,
    ItemEvent,
    ItemEventType,
    ItemStatus,
    OutboxItemInput,
    OutboxItemState,
    Recipient,
    RecipientStatus,
)
from durable_outbox_temporal.contract.lane import LaneEntry, LanePolicy, LaneState
from durable_outbox_temporal.payload_json import OutboxPayloadConverter

from workflows import carried_text

T0 = datetime(2026, 11, 30, 5, 0, 0, 123456, tzinfo=UTC)
POLICY = DeliveryPolicy(destination="mail", submit_task_queue="s", poll_task_queue="p")


def part(greeting: str = "Hi Ada") -> CarriedPart:
    """Items in each shape a shard holds (queued, begun with events and recipients, debounced)
    and a lane with a policy per destination."""
    begun = OutboxItemState(
        started=True,
        status=ItemStatus.SENDING,
        attempts=2,
        last_error="503 from the provider",
        next_attempt_at=T0 + timedelta(seconds=3),
        created_at=T0,
        updated_at=T0.replace(microsecond=0),
        recipients=[Recipient("ada@example.com", RecipientStatus.PENDING, None, None)],
        last_event_seq=3,
        events=[ItemEvent(3, ItemEventType.SUBMIT_FAILED, ItemStatus.QUEUED, T0, 2, "503")],
    )
    items = [
        OutboxItemInput(
            outbox="o",
            key=f"k{n}",
            destination="mail",
            payload={"content": {"subject": greeting}, "to": [{"address": "ada@example.com"}]},
            payload_hash="d" * 64,
            policy=POLICY,
            enqueued_at=T0,
            state=state,
            priority=priority,
            debounce=DebounceSpec("dk", 1.5, 60.0) if n == 2 else None,
        )
        for n, (state, priority) in enumerate([(None, None), (begun, 1), (None, 5)])
    ]
    lane = LaneState(
        outbox="o",
        ordering_key="customer-7",
        policy=LanePolicy.SKIP,
        entries=[LaneEntry("k9", "mail", {"n": 9}, T0, max_attempts=3)],
        head_started=True,
        policies={"mail": POLICY},
        destination="mail",
    )
    return CarriedPart(items=items, lanes=[lane])


def test_the_text_is_the_payload_converters_own_and_reads_back_equal() -> None:
    carried = part()

    text = carried_text.write(carried)

    assert text.encode() == OutboxPayloadConverter().to_payload(carried).data
    assert carried_text.read(text, CarriedPart) == carried


def test_text_past_ascii_reads_back_equal_and_as_the_converter_reads_it() -> None:
    carried = part("Grüße, 李雷 👋")

    text = carried_text.write(carried)

    assert carried_text.read(text, CarriedPart) == carried
    json_text = OutboxPayloadConverter().to_payload(carried).data.decode()
    assert json.loads(text) == json.loads(json_text)  # `\\u` escapes or not, the same JSON


def test_a_text_an_older_release_wrote_reads_nan_included() -> None:
    carried = part()
    older = OutboxPayloadConverter().to_payload(carried).data.decode()
    assert carried_text.read(older, CarriedPart) == carried
    # json wrote a NaN as `NaN`, which orjson does not read: the fallback does.
    with_nan = older.replace('"n":9', '"n":NaN')

    read = carried_text.read(with_nan, CarriedPart)

    assert math.isnan(read.lanes[0].entries[0].payload["n"])
