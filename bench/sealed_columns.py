"""What sealing the read model's columns costs (`docs/decisions/read-model-sealing.md`).

Writes the same item lifecycles (queued with a payload, accepted and polled, sent) through
`readmodel.store.apply_projections` into a fresh SQLite read model, once with plain columns and
once sealed under a payload key, alternating the two over several rounds (the machine's load
drifts between rounds, so each pair is compared, not the two series). Also times one seal and
one open of a 1 KB value on its own.

    python -m bench.sealed_columns [--items 400] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from durable_outbox_temporal.codec import EncryptionCodec, new_key_setting
from durable_outbox_temporal.contract.item import (
    ItemEvent,
    ItemEventType,
    ItemProjection,
    ItemStatus,
    OutboxItemView,
)
from durable_outbox_temporal.contract.sealed_columns import seal_with
from durable_outbox_temporal.contract.sealing import ValueKeys

from readmodel import store
from readmodel.db import create_schema, make_engine

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PAYLOAD = {"to": "grace@example.com", "subject": "Hello", "body": "x" * 1000}


@dataclass
class Round:
    plain_ms: float
    sealed_ms: float


def lifecycle(key: str) -> list[ItemProjection]:
    """An item's three projections, as its workflow and activities write them."""
    view = OutboxItemView(
        id=f"outbox/bench/{key}", outbox="bench", key=key, destination="d", status=ItemStatus.QUEUED
    )
    events = [
        (ItemEventType.ENQUEUED, ItemStatus.QUEUED, None),
        (ItemEventType.ACCEPTED, ItemStatus.SENDING, "accepted by the provider"),
        (ItemEventType.SENT, ItemStatus.SENT, "grace@example.com: delivered"),
    ]
    projections = []
    for seq, (kind, status, detail) in enumerate(events, start=1):
        at = T0 + timedelta(seconds=seq)
        projections.append(
            ItemProjection(
                replace(view, status=status, last_event_seq=seq, created_at=T0, updated_at=at),
                [ItemEvent(seq, kind, status, at, 1, detail)],
                T0,
                payload=PAYLOAD if seq == 1 else None,
            )
        )
    return projections


def write_items(keys: ValueKeys | None, items: int) -> float:
    """Milliseconds per item to write `items` lifecycles, one transaction per projection."""
    with tempfile.TemporaryDirectory() as directory:
        engine = make_engine(f"sqlite:///{Path(directory) / 'readmodel.db'}")
        create_schema(engine)
        seal_with(engine, keys)
        lifecycles = [lifecycle(f"k{n}") for n in range(items)]
        started = time.perf_counter()
        for projections in lifecycles:
            for projection in projections:
                store.apply_projection(engine, projection)
        elapsed = time.perf_counter() - started
        engine.dispose()
    return elapsed / items * 1000


def seal_and_open_us(keys: ValueKeys, times: int = 10_000) -> float:
    """Microseconds to seal and open one 1 KB value."""
    value = str(PAYLOAD).encode()
    started = time.perf_counter()
    for _ in range(times):
        keys.open(keys.seal(value))
    return (time.perf_counter() - started) / times * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--items", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    keys = EncryptionCodec.from_setting(new_key_setting("bench")).value_keys()
    print(f"seal + open of a 1 KB value: {seal_and_open_us(keys):.1f} us")
    rounds = [
        Round(write_items(None, args.items), write_items(keys, args.items))
        for _ in range(args.rounds)
    ]
    for n, measured in enumerate(rounds, start=1):
        print(f"round {n}: plain {measured.plain_ms:.2f} ms/item, sealed {measured.sealed_ms:.2f}")
    ratio = statistics.median(r.sealed_ms / r.plain_ms for r in rounds)
    print(f"median sealed/plain per round: {ratio:.2f}")


if __name__ == "__main__":
    main()
