"""What an aggregate's data key costs the event store's write path
(`docs/decisions/aggregate-crypto-shredding.md`).

Writes single-event batches (as an aggregate's store activity does) through
`readmodel.aggregates.store_events` into a fresh SQLite read model, alternating rounds that look
the aggregate's key up in the write's transaction (the product) with rounds that seal under a key
held in memory (what a per-process cache would cost, were it safe across processes), so each
pair is compared under the same load.

    python -m bench.data_keys [--writes 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from unittest import mock

from durable_outbox_temporal.contract.aggregate import RecordedEvent, StoreEvents
from sqlalchemy import Engine

from readmodel import aggregates, data_keys
from readmodel.db import create_schema, make_engine

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def write(engine: Engine, writes: int) -> float:
    """Milliseconds per single-event write to one fresh aggregate."""
    aggregate_id = uuid.uuid4().hex
    started = time.perf_counter()
    for seq in range(1, writes + 1):
        event = RecordedEvent(seq, "SeatAssigned", {"seat": f"{seq}A", "passenger_id": "p1"}, T0)
        aggregates.store_events(
            engine, StoreEvents("flight", aggregate_id, [event], seq, {"seats": {}}, T0)
        )
    return (time.perf_counter() - started) / writes * 1000


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--writes", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        engine = make_engine(f"sqlite:///{Path(folder) / 'readmodel.db'}")
        create_schema(engine)
        with engine.begin() as connection:
            held = data_keys.current_key(connection, "bench")
        ratios = []
        for n in range(1, args.rounds + 1):
            looked_up = write(engine, args.writes)
            with mock.patch.object(data_keys, "current_key", lambda connection, scope: held):
                in_memory = write(engine, args.writes)
            ratios.append(looked_up / in_memory)
            print(f"round {n}: key looked up {looked_up:.2f} ms/write, held {in_memory:.2f}")
        engine.dispose()
    print(f"median looked-up/held per round: {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
