"""What the attempt log costs a request: its exchanges written before the request returns (one
transaction per exchange, as the log was written first) against handed to the process's
`AttemptLog` (batches off the request's path), in alternating rounds on one SQLite read model.

`python -m bench.attempt_log` prints each way's request latency (p50 / p99) and the time until
every row is written. Why it matters: docs/decisions/attempt-log-off-the-path.md
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
        finally:
            engine.dispose()
    return {
        way: {
            figure: round(statistics.median(r[figure] for r in rounds), 3) for figure in rounds[0]
        }
        for way, rounds in results.items()
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(measure()), indent=2))
