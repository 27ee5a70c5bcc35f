"""Retention's pruning on PostgreSQL, measured: rows pruned per second, and the API's item GET
latency while it runs.

`python -m bench.retention [--items N] [--page P]` fills a fresh schema of the PostgreSQL at
`--postgres-url` with N ended items past their retention (each with a payload, two events and an
attempt) plus `--kept` recent ones, then prunes the payloads and then the rows, page by page as
the `Retention` workflow's activities do (`readmodel/retention.py`), while a client GETs random
kept items through the real API (in process, read-model answers) at a steady rate. The same GETs
with nothing running give the baseline. Writes `.bench/retention.json`; the schema is dropped.
The figure that counts is at full size (`--items 1000000`, docs/decisions/retention-pages.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from durable_outbox_temporal.contract.ids import item_workflow_id
from durable_outbox_temporal.contract.retention import (
    PRUNE_PAGE_SIZE,
    PruneCursor,
    PrunePageResult,
    RetentionRule,
)
from durable_outbox_temporal.destinations import Destination, DestinationRegistry
from sqlalchemy import Engine, insert, text

from api.main import create_app
from bench.run import machine
from configuration.settings import PROJECT_ROOT, Settings
from readmodel.db import create_schema, make_engine
from readmodel.models import EVENTS, ITEM_ATTEMPTS, ITEMS
from readmodel.retention import prune_payloads, prune_rows

POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
OUTBOX = "bench"
DESTINATION = "bench-webhook"
FILL_CHUNK = 5000
GET_RATE = 50.0
OUTPUT = PROJECT_ROOT / ".bench" / "retention.json"
RULE = RetentionRule(DESTINATION, None, payload_retention_s=7 * 86400, item_retention_s=14 * 86400)


def rows(keys: list[str], finished_at: datetime) -> tuple[list[dict[str, Any]], ...]:
    """The item, event and attempt rows of ended items, as the projection leaves them."""
    items, events, attempts = [], [], []
    for key in keys:
        item_id = item_workflow_id(OUTBOX, key)
        items.append(
            {
                "id": item_id,
                "outbox": OUTBOX,
                "key": key,
                "destination": DESTINATION,
                "status": "sent",
                "attempts": 1,
                "max_attempts": 8,
                "poll_count": 0,
                "created_at": finished_at - timedelta(seconds=5),
                "updated_at": finished_at,
                "finished_at": finished_at,
                "last_event_seq": 2,
                "payload_hash": f"h{key}",
                "payload": {"to": f"{key}@example.com", "body": "x" * 400},
            }
        )
        for seq, kind in ((1, "enqueued"), (2, "sent")):
            events.append(
                {
                    "item_id": item_id,
                    "outbox": OUTBOX,
                    "seq": seq,
                    "type": kind,
                    "status": "queued" if seq == 1 else "sent",
                    "at": finished_at,
                    "attempt": seq - 1,
                    "detail": None,
                }
            )
        attempts.append(
            {
                "item_id": item_id,
                "n": 1,
                "kind": "submit",
                "started_at": finished_at,
                "latency_ms": 30,
                "method": "POST",
                "host": "hooks.example",
                "path": "/hook",
                "request_headers": {"content-type": "application/json"},
                "status": 204,
                "response_headers": {"server": "bench"},
                "body": "ok",
                "body_truncated": False,
            }
        )
    return items, events, attempts


def fill(engine: Engine, count: int, finished_at: datetime, prefix: str) -> None:
    for start in range(0, count, FILL_CHUNK):
        keys = [f"{prefix}-{n}" for n in range(start, min(start + FILL_CHUNK, count))]
        items, events, attempts = rows(keys, finished_at)
        with engine.begin() as connection:
            connection.execute(insert(ITEMS), items)
            connection.execute(insert(EVENTS), events)
            connection.execute(insert(ITEM_ATTEMPTS), attempts)


def summary(samples_ms: list[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)

    def rank(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {
        "gets": len(ordered),
        "p50_ms": rank(0.5),
        "p95_ms": rank(0.95),
        "p99_ms": rank(0.99),
        "mean_ms": round(statistics.fmean(ordered), 2),
    }


async def gets_while(
    http: httpx.AsyncClient, keys: list[str], running: Callable[[], bool]
) -> list[float]:
    """GET random kept items at `GET_RATE` while `running()`; each latency in ms."""
    samples: list[float] = []
    begin = time.perf_counter()
    while running():
        delay = begin + len(samples) / GET_RATE - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        started = time.perf_counter()
        response = await http.get(f"/v1/outboxes/{OUTBOX}/items/{random.choice(keys)}")
        if response.status_code != 200:
            raise RuntimeError(f"GET answered {response.status_code}: {response.text}")
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def phase(
    http: httpx.AsyncClient,
    keys: list[str],
    prune: Callable[[PruneCursor | None], PrunePageResult],
) -> dict[str, Any]:
    """Run `prune` page after page on a thread, each after the last (as the `Retention`
    workflow does), until a page says there is no more, GETs alongside."""
    pruned = 0
    pages = 0
    done = threading.Event()

    def work() -> None:
        nonlocal pruned, pages
        try:
            after, more = None, True
            while more:
                page = prune(after)
                pruned += page.pruned
                pages += 1
                after, more = page.last, page.more
        finally:
            done.set()

    started = time.perf_counter()
    worker = asyncio.create_task(asyncio.to_thread(work))
    latencies = await gets_while(http, keys, lambda: not done.is_set())
    await worker
    seconds = time.perf_counter() - started
    return {
        "rows": pruned,
        "pages": pages,
        "seconds": round(seconds, 2),
        "rows_per_s": round(pruned / seconds, 1),
        "get_latency_while_pruning": summary(latencies),
    }


async def measure(engine: Engine, items: int, kept: int, page: int) -> dict[str, Any]:
    now = datetime.now(UTC)
    started = time.perf_counter()
    fill(engine, items, now - timedelta(days=30), "old")
    fill(engine, kept, now - timedelta(days=1), "kept")
    filled_s = time.perf_counter() - started
    with engine.begin() as connection:
        connection.execute(text("ANALYZE"))
    kept_keys = [f"kept-{n}" for n in range(kept)]
    registry = DestinationRegistry(
        {
            DESTINATION: Destination.model_validate(
                {
                    "name": DESTINATION,
                    "provider": "webhook",
                    "settings": {"url": "http://127.0.0.1:9/"},
                }
            )
        }
    )
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    app = create_app(settings, destinations=registry, engine=engine)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            baseline_until = time.perf_counter() + 5
            idle = await gets_while(http, kept_keys, lambda: time.perf_counter() < baseline_until)
            payloads = await phase(
                http,
                kept_keys,
                lambda after: prune_payloads(
                    engine, RULE, now - timedelta(days=7), page, after=after
                ),
            )
            rows_ = await phase(
                http,
                kept_keys,
                lambda after: prune_rows(engine, RULE, now - timedelta(days=14), page, after=after),
            )
    return {
        "items": items,
        "kept": kept,
        "page": page,
        "fill_seconds": round(filled_s, 1),
        "get_latency_idle": summary(idle),
        "payloads": payloads,
        "rows": rows_,
        "machine": machine(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=1_000_000, help="ended items to prune")
    parser.add_argument("--kept", type=int, default=1000, help="recent items the GETs read")
    parser.add_argument("--page", type=int, default=PRUNE_PAGE_SIZE, help="items per page")
    parser.add_argument("--postgres-url", default=POSTGRES_URL)
    args = parser.parse_args(argv)
    schema = f"bench_retention_{uuid.uuid4().hex[:8]}"
    admin = make_engine(args.postgres_url)
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    engine = make_engine(f"{args.postgres_url}?options=-csearch_path%3D{schema}")
    try:
        create_schema(engine)
        result = asyncio.run(measure(engine, args.items, args.kept, args.page))
    finally:
        engine.dispose()
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()
    OUTPUT.parent.mkdir(exist_ok=True)
    OUTPUT.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
