"""The payload converter's cost per round trip (`python -m bench.payload_json`): the SDK's
default JSON converter beside the product's (`durable_outbox_temporal/payload_json.py`), on the
payloads a delivery sends most (an item's input, a submit request with its projection context, a
shard's enqueue of two items), encoded and decoded in alternating rounds."""

from __future__ import annotations

import json
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from durable_outbox_temporal.codec import data_converter
from durable_outbox_temporal.contract.bulk import ShardEnqueue
from durable_outbox_temporal.contract.item import (
    ItemEvent,
    ItemEventType,
    ItemStatus,
    OutboxItemInput,
    OutboxItemState,
    ProjectionContext,
    SubmitRequest,
)
from durable_outbox_temporal.destinations import Destination
from temporalio.converter import DataConverter, PayloadConverter

ROUNDS = 5
PER_ROUND = 500


def payloads() -> dict[str, tuple[Any, type]]:
    now = datetime.now(UTC)
    destination = Destination.model_validate(
        {"name": "hook", "provider": "webhook", "settings": {"url": "http://x"}}
    )
    state = OutboxItemState(
        started=True,
        created_at=now,
        events=[ItemEvent(seq=1, type=ItemEventType.ENQUEUED, status=ItemStatus.QUEUED, at=now)],
    )
    item = OutboxItemInput(
        outbox="bench",
        key="k",
        destination="hook",
        payload={"to": "a@example.com", "body": {"lines": ["x"] * 10}},
        payload_hash="h",
        policy=destination.policy(),
        ordering_key="lane",
        enqueued_at=now,
        not_before=now + timedelta(seconds=1),
        state=state,
    )
    request = SubmitRequest(
        destination="hook",
        item_id="outbox/bench/k",
        idempotency_key="k",
        payload=item.payload,
        attempt=1,
        projection=ProjectionContext(item=item, state=state),
    )
    return {
        "item_input": (item, OutboxItemInput),
        "submit_request": (request, SubmitRequest),
        "shard_enqueue_of_2": (ShardEnqueue(items=[item, item]), ShardEnqueue),
    }


def round_trip_us(converter: PayloadConverter, value: Any, kind: type) -> float:
    began = time.perf_counter()
    for _ in range(PER_ROUND):
        converter.from_payloads(converter.to_payloads([value]), [kind])
    return (time.perf_counter() - began) / PER_ROUND * 1e6


def main() -> None:
    converters = {
        "sdk_default": DataConverter.default.payload_converter,
        "product": data_converter(None).payload_converter,
    }
    figures: dict[str, float] = {}
    for name, (value, kind) in payloads().items():
        times: dict[str, list[float]] = {key: [] for key in converters}
        for _ in range(ROUNDS):
            for key, converter in converters.items():
                times[key].append(round_trip_us(converter, value, kind))
        for key, values in times.items():
            figures[f"{name}_{key}_us"] = round(statistics.median(values), 1)
        figures[f"{name}_ratio"] = round(
            figures[f"{name}_product_us"] / figures[f"{name}_sdk_default_us"], 3
        )
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
