"""What the attempt log costs a request: its exchanges written before the request returns (one
transaction per exchange, as the log was written first) against handed to the process's
`AttemptLog` (batches off the request's path), in alternating rounds on one SQLite read model.

`python -m bench.attempt_log` prints each way's request latency (p50 / p99) and the time until
every row is written. Why it matters: docs/decisions/attempt-log-off-the-path.md

It also prints the writer's CPU per attempt for a batch written as one INSERT of many rows (what
`write_batch` does) against one INSERT ... SELECT per attempt in the same transaction (how
batches were written before), in alternating rounds: docs/decisions/attempt-log-batches.md.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from readmodel import attempts
from readmodel.db import create_schema, make_engine

REQUESTS = 400
CONCURRENT = 20
ROUNDS = 3
# A submit with its first poll: two exchanges per request.
EXCHANGES = 2


def _made(kind: str) -> list[attempts.Attempt]:
    now = datetime.now(UTC)
    return [
        attempts.Attempt(kind, now, 5, "POST", "hook.test", "/in", {}, status=202)
        for _ in range(EXCHANGES)
    ]


async def _round(log: attempts.AttemptLog, handed_over: bool, run: str) -> dict[str, float]:
    latencies: list[float] = []
    limit = asyncio.Semaphore(CONCURRENT)

    async def request(n: int) -> None:
        async with limit:
            started = time.perf_counter()
            made = _made("submit")
            if handed_over:
                log.add(f"outbox/bench/{run}-{n}", made)
            else:
                await asyncio.to_thread(
                    attempts.write_attempts, log.engine, f"outbox/bench/{run}-{n}", made
                )
            latencies.append((time.perf_counter() - started) * 1000)

    began = time.perf_counter()
    await asyncio.gather(*(request(n) for n in range(REQUESTS)))
    await log.flush()
    written_s = time.perf_counter() - began
    ordered = sorted(latencies)
    return {
        "p50_ms": round(statistics.median(ordered), 3),
        "p99_ms": round(ordered[int(0.99 * len(ordered))], 3),
        "rows_per_s": round(REQUESTS * EXCHANGES / written_s, 1),
    }


BATCHES = 100
BATCH = 20


def _batch(run: str) -> list[tuple[str, attempts.Attempt]]:
    made = _made("submit") * (BATCH // EXCHANGES)
    return [(f"outbox/bench/{run}-{n}", attempt) for n, attempt in enumerate(made)]


def _one_statement_each(engine: Engine, batch: list[tuple[str, attempts.Attempt]]) -> None:
    with engine.begin() as connection:
        for item_id, attempt in batch:
            attempts._insert(connection, item_id, attempt)  # noqa: SLF001 - the old way, measured


def writer_cpu(engine: Engine) -> dict[str, float]:
    """The writer's CPU per attempt, each way, median of alternating rounds."""
    ways = {
        "one_insert_per_batch": attempts.write_batch,
        "one_insert_per_attempt": _one_statement_each,
    }
    spent: dict[str, list[float]] = {way: [] for way in ways}
    for number in range(ROUNDS * 2):
        for way, write in ways.items():
            started = time.process_time()
            for batch in range(BATCHES):
                write(engine, _batch(f"{way}-{number}-{batch}"))
            spent[way].append((time.process_time() - started) / (BATCHES * BATCH) * 1000)
    return {f"{way}_cpu_ms": round(statistics.median(v), 3) for way, v in spent.items()}


async def measure() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as directory:
        engine = make_engine(f"sqlite:///{Path(directory) / 'readmodel.db'}")
        create_schema(engine)
        log = attempts.AttemptLog(engine)
        results: dict[str, list[dict[str, float]]] = {"awaited": [], "handed_over": []}
        try:
            for number in range(ROUNDS):
                for way in results:
                    results[way].append(await _round(log, way == "handed_over", f"{way}-{number}"))
            writer = writer_cpu(engine)
        finally:
            engine.dispose()
    return {
        **{
            way: {
                figure: round(statistics.median(r[figure] for r in rounds), 3)
                for figure in rounds[0]
            }
            for way, rounds in results.items()
        },
        "writer_per_attempt": writer,
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(measure()), indent=2))
