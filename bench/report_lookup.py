"""How a delivery report finds its item: a search attribute or the read model, measured.

`python -m bench.report_lookup [--items N] [--lookups M]` starts a dev server (WAL SQLite, as
`make dev`) with an extra `ProviderMessageId` keyword search attribute, starts N workflows that
carry it (no worker: they just sit), fills read models (SQLite, and PostgreSQL when reachable)
with N items, then times M lookups of random message ids each way, side by side, and how long
a new workflow takes to become findable by visibility. Writes `.bench/report_lookup.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, select, text
from temporalio.client import Client
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.testing import WorkflowEnvironment

from common.settings import PROJECT_ROOT
from contract import search_attributes
from contract.item import ItemStatus, OutboxItemView
from devstack.temporal_server import dev_server_extra_args, temporal_cli_path
from readmodel.db import create_schema, make_engine
from readmodel.models import ITEMS

PROVIDER_MESSAGE_ID = SearchAttributeKey.for_keyword("ProviderMessageId")
POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
TASK_QUEUE = "report-lookup-probe"  # no worker polls it


def summary(samples_ms: list[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)

    def pct(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))], 3)

    return {
        "p50_ms": pct(0.50),
        "p95_ms": pct(0.95),
        "p99_ms": pct(0.99),
        "mean_ms": round(statistics.fmean(ordered), 3),
    }


async def timed(calls: list[Callable[[], Awaitable[Any]]]) -> list[float]:
    samples = []
    for call in calls:
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def start_probes(client: Client, message_ids: list[str]) -> None:
    limit = asyncio.Semaphore(50)

    async def one(message_id: str) -> None:
        async with limit:
            await client.start_workflow(
                "LookupProbe",
                id=f"outbox/bench/{message_id}",
                task_queue=TASK_QUEUE,
                search_attributes=TypedSearchAttributes(
                    [
                        SearchAttributePair(PROVIDER_MESSAGE_ID, message_id),
                        SearchAttributePair(search_attributes.OUTBOX_NAME, "bench"),
                    ]
                ),
            )

    await asyncio.gather(*(one(message_id) for message_id in message_ids))


async def visibility_lookup(client: Client, message_id: str) -> str:
    async for workflow in client.list_workflows(f"ProviderMessageId = '{message_id}'"):
        return workflow.id
    raise LookupError(message_id)


def fill_read_model(engine: Engine, message_ids: list[str]) -> None:
    now = datetime.now(UTC)
    rows = [
        {
            **dataclasses.asdict(
                OutboxItemView(
                    id=f"outbox/bench/{message_id}",
                    outbox="bench",
                    key=message_id,
                    destination="email",
                    status=ItemStatus.SENT,
                    created_at=now,
                    provider_message_id=message_id,
                )
            ),
            "payload": None,
        }
        for message_id in message_ids
    ]
    with engine.begin() as connection:
        connection.execute(ITEMS.insert(), rows)


def read_model_lookup(engine: Engine, message_id: str) -> str:
    query = select(ITEMS.c.id).where(ITEMS.c.provider_message_id == message_id)
    with engine.connect() as connection:
        found = connection.scalar(query)
    if found is None:
        raise LookupError(message_id)
    return str(found)


async def read_model_samples(engine: Engine, message_ids: list[str], picks: list[str]) -> Any:
    create_schema(engine)
    fill_read_model(engine, message_ids)
    read_model_lookup(engine, picks[0])  # warm the pool
    return summary(
        await timed(
            [functools.partial(asyncio.to_thread, read_model_lookup, engine, m) for m in picks]
        )
    )


async def freshness(client: Client, count: int) -> dict[str, float]:
    """Start → findable by a visibility query, for workflows started with the attribute."""
    samples = []
    for _ in range(count):
        message_id = str(uuid.uuid4())
        await start_probes(client, [message_id])
        started = time.perf_counter()
        while True:
            try:
                await visibility_lookup(client, message_id)
                break
            except LookupError:
                await asyncio.sleep(0.01)
        samples.append((time.perf_counter() - started) * 1000)
    return summary(samples)


async def main(items: int, lookups: int) -> dict[str, Any]:
    message_ids = [str(uuid.uuid4()) for _ in range(items)]
    picks = [random.choice(message_ids) for _ in range(lookups)]
    results: dict[str, Any] = {"items": items, "lookups": lookups}
    with tempfile.TemporaryDirectory() as scratch:
        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=temporal_cli_path(),
            dev_server_extra_args=[
                *dev_server_extra_args(Path(scratch) / "temporal.db"),
                "--search-attribute",
                "ProviderMessageId=Keyword",
                "--log-level",
                "error",
            ],
        )
        async with env:
            await start_probes(env.client, message_ids)
            await visibility_lookup(env.client, picks[0])
            results["search_attribute"] = summary(
                await timed([functools.partial(visibility_lookup, env.client, m) for m in picks])
            )
            results["visibility_freshness"] = await freshness(env.client, 50)
        sqlite = make_engine(f"sqlite:///{Path(scratch) / 'readmodel.db'}")
        results["read_model_sqlite"] = await read_model_samples(sqlite, message_ids, picks)
        sqlite.dispose()
    schema = f"bench_lookup_{uuid.uuid4().hex[:8]}"
    admin = create_engine(POSTGRES_URL)
    try:
        with admin.begin() as connection:
            connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    except Exception as err:  # noqa: BLE001 - PostgreSQL is optional for this measurement
        print(f"PostgreSQL unreachable ({type(err).__name__}); skipped")
    else:
        postgres = create_engine(POSTGRES_URL, connect_args={"options": f"-csearch_path={schema}"})
        try:
            results["read_model_postgres"] = await read_model_samples(postgres, message_ids, picks)
        finally:
            postgres.dispose()
            with admin.begin() as connection:
                connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    admin.dispose()
    return results


def report(results: dict[str, Any]) -> str:
    lines = [
        f"Finding an item by provider message id: {results['items']} items,"
        f" {results['lookups']} lookups",
        f"{'lookup':<30}{'p50 ms':>10}{'p95 ms':>10}{'p99 ms':>10}{'mean ms':>10}",
    ]
    for name in ("search_attribute", "read_model_sqlite", "read_model_postgres"):
        if name in results:
            r = results[name]
            lines.append(
                f"{name:<30}{r['p50_ms']:>10}{r['p95_ms']:>10}{r['p99_ms']:>10}{r['mean_ms']:>10}"
            )
    fresh = results["visibility_freshness"]
    lines.append(
        f"{'visibility: start → findable':<30}{fresh['p50_ms']:>10}{fresh['p95_ms']:>10}"
        f"{fresh['p99_ms']:>10}{fresh['mean_ms']:>10}"
    )
    lines.append(
        "Write side: the search attribute costs one UpsertWorkflowSearchAttributes per item (a"
        " history event, a visibility write, a billable action); the read model costs nothing"
        " new (the accept's projection already writes provider_message_id)."
    )
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--lookups", type=int, default=300)
    args = parser.parse_args()
    figures = asyncio.run(main(args.items, args.lookups))
    print(report(figures))
    out = PROJECT_ROOT / ".bench" / "report_lookup.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(figures, indent=2))
