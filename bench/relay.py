"""The relay's lag under load (`make bench`): rows committed through `enqueue_in` at a steady
rate while the stack's worker relays them; lag is each row's commit to its relay."""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from typing import Any

from durable_outbox_temporal.transactional import enqueue_in
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from bench.naive import EMAIL
from readmodel.db import make_engine
from readmodel.models import OUTBOX_PENDING


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def relay_lag(
    database_url: str, destination: str, rate: float, seconds: float
) -> dict[str, Any]:
    """Commit `rate` rows a second for `seconds`, wait for the relay, return the lag figures."""
    engine = make_engine(database_url)
    run = uuid.uuid4().hex[:8]
    count = int(rate * seconds)
    try:
        started = time.monotonic()
        for n in range(count):
            await asyncio.to_thread(_commit_one, engine, destination, f"{run}-{n}")
            await asyncio.sleep(max(0.0, started + (n + 1) / rate - time.monotonic()))
        deadline = time.monotonic() + 120
        while True:
            rows = await asyncio.to_thread(_rows, engine, run)
            if len(rows) == count and all(row.relayed_at is not None for row in rows):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"relay: {sum(r.relayed_at is not None for r in rows)}/{count} relayed"
                )
            await asyncio.sleep(0.2)
    finally:
        engine.dispose()
    lags = [(row.relayed_at - row.created_at).total_seconds() * 1000 for row in rows]
    return {
        "relay_rows": count,
        "relay_lag_p50_ms": round(statistics.median(lags), 1),
        "relay_lag_p99_ms": round(percentile(lags, 0.99), 1),
    }


def _commit_one(engine: Engine, destination: str, key: str) -> None:
    with Session(engine) as session, session.begin():
        # A body the provider takes: the rows' items are delivered after they are relayed.
        enqueue_in(session, outbox="relay-bench", destination=destination, payload=EMAIL, key=key)


def _rows(engine: Engine, run: str) -> list[Any]:
    with engine.connect() as connection:
        return list(
            connection.execute(
                select(OUTBOX_PENDING.c.created_at, OUTBOX_PENDING.c.relayed_at).where(
                    OUTBOX_PENDING.c.key.like(f"{run}-%")
                )
            ).all()
        )
