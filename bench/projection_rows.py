"""What writing an item's projection costs the writer's CPU, its row built from `dataclasses.asdict`
copies of the view and event or from their values as they are (`readmodel.store.field_values`).

A read model of its own on SQLite; 4,000 projections of 2,000 items (a `sending` and a `sent`
each, as a worker's submit and poll write them), 20 to a transaction as the group-committing
writer batches them under load, in six alternating rounds. `python -m bench.projection_rows`;
docs/decisions/projection-rows-without-copies.md
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
import unittest.mock
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from durable_outbox_temporal.contract.item import (
    ItemEvent,
    ItemEventType,
    ItemProjection,
    ItemStatus,
    OutboxItemView,
)

from readmodel import store
from readmodel.db import create_schema, make_engine

ITEMS = 2000
BATCH = 20
ROUNDS = 6
KINDS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "asdict copies": dataclasses.asdict,
    "values as they are": store.field_values,
}


def _projections(outbox: str) -> list[ItemProjection]:
    now = datetime.now(UTC)
    projections = []
    for n in range(ITEMS):
        key = f"{n}-{uuid.uuid4().hex[:6]}"
        for seq, status, event in (
            (2, ItemStatus.SENDING, ItemEventType.ACCEPTED),
            (3, ItemStatus.SENT, ItemEventType.SENT),
        ):
            view = OutboxItemView(
                id=f"outbox/{outbox}/{key}",
                outbox=outbox,
                key=key,
                destination="bench-email",
                status=status,
                attempts=1,
                max_attempts=5,
                operation_url="http://127.0.0.1:9/operations/1",
                created_at=now,
                updated_at=now,
                finished_at=now if status is ItemStatus.SENT else None,
                payload_hash="0" * 64,
                provider_message_id="message-1",
                last_event_seq=seq,
            )
            happened = ItemEvent(seq=seq, type=event, status=status, at=now, attempt=1)
            projections.append(ItemProjection(view=view, events=[happened], enqueued_at=now))
    return projections


def _cpu_ms_per_projection(engine: Any, kind: str) -> float:
    projections = _projections(f"rows-{uuid.uuid4().hex[:8]}")
    with unittest.mock.patch.object(store, "field_values", KINDS[kind]):
        started = time.process_time()
        for first in range(0, len(projections), BATCH):
            store.apply_projections(engine, projections[first : first + BATCH])
        return (time.process_time() - started) * 1000 / len(projections)


def main() -> None:
    figures: dict[str, list[float]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory() as folder:
        engine = make_engine(f"sqlite:///{Path(folder) / 'rows.db'}")
        create_schema(engine)
        _cpu_ms_per_projection(engine, "values as they are")  # warm-up: statements compiled
        for round_ in range(ROUNDS):
            for kind in list(KINDS) if round_ % 2 == 0 else list(reversed(KINDS)):
                figures[kind].append(_cpu_ms_per_projection(engine, kind))
        engine.dispose()
    for kind, values in figures.items():
        shown = ", ".join(f"{value:.3f}" for value in values)
        median = statistics.median(values)
        print(f"{kind:>18}: writer CPU ms per projection {shown} (median {median:.3f})")


if __name__ == "__main__":
    main()
