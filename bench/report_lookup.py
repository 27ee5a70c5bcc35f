"""How a delivery report finds its item: a search attribute or the read model, measured.

`python -m bench.report_lookup [--items N] [--lookups M]` starts a dev server (WAL SQLite, as
`make dev`) with an extra `ProviderMessageId` keyword search attribute and N workflows that carry
it (no worker: they just sit Running), fills read models (SQLite, and PostgreSQL when reachable)
with the same N items, then times M lookups of random message ids each way, side by side, and how
long a new workflow takes to become findable by a visibility query. Writes
`.bench/report_lookup.json`.

Lookups are paced below the dev server's visibility rate limit so (a) is timed unthrottled; the
same lookups back to back then show what the limit does to a burst of reports.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import hashlib
import json
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from durable_outbox_temporal.contract import search_attributes
from durable_outbox_temporal.contract.item import (
    DeliveryOutcome,
    ItemStatus,
    OutboxItemView,
    Recipient,
    RecipientStatus,
)
from sqlalchemy import Engine, inspect, text
from sqlalchemy.exc import DBAPIError
from temporalio.api.workflowservice.v1 import ListWorkflowExecutionsRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from bench.run import machine
from configuration.settings import PROJECT_ROOT
from devstack.temporal_server import dev_server_extra_args, temporal_cli_path
from readmodel import store
from readmodel.db import create_schema, make_engine
from readmodel.models import ITEMS

PROVIDER_MESSAGE_ID = SearchAttributeKey.for_keyword("ProviderMessageId")
POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
OUTBOX = "bench"
DESTINATION = "bench-email"
TASK_QUEUE = "report-lookup-probe"  # no worker polls it: the probes just sit Running
START_CONCURRENCY = 50
WARM_UP_LOOKUPS = 10
# Every lookup path is timed at this fixed rate: a steady report stream, and below the dev
# server's visibility limit (it raises `frontend.namespaceRPS.visibility` from 10/s to 100/s).
LOOKUP_RATE = 50.0
RATE_LIMIT_WINDOW_S = 3.0
FRESHNESS_PROBES = 50
FRESHNESS_POLL_S = 0.01
INDEX_NAME = "ix_outbox_items_provider_message_id"
LOOKUP_SQL = "SELECT id FROM outbox_items WHERE provider_message_id = :m"
OUTPUT = PROJECT_ROOT / ".bench" / "report_lookup.json"
WRITE_SIDE = {
    "search_attribute": (
        "one extra UpsertWorkflowSearchAttributes command per item when the provider accepts"
        " the send: one more history event, one more visibility write and one more Temporal"
        " Cloud billable action per item"
    ),
    "read_model": (
        "nothing new: the projection already writes provider_message_id when the item is"
        " accepted (the index adds one B-tree entry to that same write)"
    ),
}
FRESHNESS_VARIANT = (
    "search attribute set at start_workflow; the upsert variant is skipped because an upsert"
    " needs a worker to run the workflow task that issues it (and then adds that task's time)"
)


@dataclass(frozen=True)
class Item:
    """One probe: the item workflow id and the provider's message id it is found by."""

    item_id: str
    message_id: str


def summary(samples_ms: list[float]) -> dict[str, float]:
    """p50/p95/p99/mean in ms, with the same rank rule as `bench/run.py`."""
    ordered = sorted(samples_ms)

    def rank(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {
        "p50_ms": rank(0.50),
        "p95_ms": rank(0.95),
        "p99_ms": rank(0.99),
        "mean_ms": round(statistics.fmean(ordered), 3),
    }


async def timed(
    calls: Sequence[Callable[[], Awaitable[object]]], rate: float | None = LOOKUP_RATE
) -> list[float]:
    """Latency of each call in ms, one after another, started `rate` per second (None: back to
    back)."""
    samples = []
    begin = time.perf_counter()
    for index, call in enumerate(calls):
        if rate is not None:
            delay = begin + index / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def start_probe(client: Client, item: Item) -> None:
    await client.start_workflow(
        "LookupProbe",
        id=item.item_id,
        task_queue=TASK_QUEUE,
        search_attributes=TypedSearchAttributes(
            [
                SearchAttributePair(PROVIDER_MESSAGE_ID, item.message_id),
                SearchAttributePair(search_attributes.OUTBOX_NAME, OUTBOX),
            ]
        ),
    )


async def start_probes(client: Client, items: list[Item]) -> None:
    limit = asyncio.Semaphore(START_CONCURRENCY)

    async def one(item: Item) -> None:
        async with limit:
            await start_probe(client, item)

    await asyncio.gather(*(one(item) for item in items))


async def wait_until_visible(client: Client, count: int, timeout_s: float = 60) -> None:
    """Wait until visibility lists all `count` probes, so the lookups do not race its backlog."""
    deadline = time.monotonic() + timeout_s
    query = f"TaskQueue = '{TASK_QUEUE}'"
    while (await client.count_workflows(query)).count < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"visibility did not list {count} probes in {timeout_s:.0f} s")
        await asyncio.sleep(0.1)


async def visibility_lookup(client: Client, message_id: str) -> str | None:
    async for workflow in client.list_workflows(f"ProviderMessageId = '{message_id}'"):
        return workflow.id
    return None


async def found_by_visibility(client: Client, item: Item) -> None:
    if await visibility_lookup(client, item.message_id) != item.item_id:
        raise LookupError(item.message_id)


async def admitted_list_calls(client: Client, message_id: str, seconds: float) -> dict[str, Any]:
    """Back-to-back list calls without the SDK's retries: how many the namespace limit admits."""
    request = ListWorkflowExecutionsRequest(
        namespace=client.namespace, query=f"ProviderMessageId = '{message_id}'"
    )
    admitted = throttled = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            await client.workflow_service.list_workflow_executions(request, retry=False)
            admitted += 1
        except RPCError as err:
            if err.status != RPCStatusCode.RESOURCE_EXHAUSTED:
                raise
            throttled += 1
    return {
        "admitted_per_s": round(admitted / seconds, 1),
        "throttled_per_s": round(throttled / seconds, 1),
    }


def item_row(item: Item, key: str, now: datetime) -> dict[str, Any]:
    """A row as the projection leaves an accepted email: sending, two recipients pending."""
    view = OutboxItemView(
        id=item.item_id,
        outbox=OUTBOX,
        key=key,
        destination=DESTINATION,
        status=ItemStatus.SENDING,
        attempts=1,
        max_attempts=10,
        next_attempt_at=now + timedelta(seconds=5),
        operation_url=f"https://bench.communication.azure.com/emails/operations/{item.message_id}",
        poll_count=1,
        created_at=now,
        updated_at=now,
        payload_hash=hashlib.sha256(key.encode()).hexdigest(),
        provider_message_id=item.message_id,
        recipients=[
            Recipient(address="customer@example.com", status=RecipientStatus.PENDING),
            Recipient(address="audit@example.com", status=RecipientStatus.PENDING),
        ],
        delivery=DeliveryOutcome.PENDING,
        last_event_seq=3,
    )
    payload = {
        "senderAddress": "orders@example.com",
        "recipients": {
            "to": [{"address": "customer@example.com"}],
            "bcc": [{"address": "audit@example.com"}],
        },
        "content": {"subject": f"Your order {key}", "plainText": "Thank you for your order."},
    }
    return {**dataclasses.asdict(view), "payload": payload}


def fill_read_model(engine: Engine, items: list[Item]) -> bool:
    """Migrate, insert the items, make sure the lookup index exists; True if the schema had it."""
    create_schema(engine)
    had_index = INDEX_NAME in {index["name"] for index in inspect(engine).get_indexes(ITEMS.name)}
    now = datetime.now(UTC)
    rows = [item_row(item, item.item_id.rsplit("/", 1)[1], now) for item in items]
    with engine.begin() as connection:
        connection.execute(ITEMS.insert(), rows)
        connection.execute(
            text(f"CREATE INDEX IF NOT EXISTS {INDEX_NAME} ON outbox_items (provider_message_id)")
        )
        # Fresh statistics, as a table that has lived a while would have.
        connection.execute(text("ANALYZE"))
    return had_index


def query_plan(engine: Engine, message_id: str) -> str:
    """How the database runs the lookup: it must use the index, not scan the table."""
    with engine.connect() as connection:
        if engine.dialect.name == "sqlite":
            rows = connection.execute(text(f"EXPLAIN QUERY PLAN {LOOKUP_SQL}"), {"m": message_id})
            return "; ".join(str(row[-1]) for row in rows)
        rows = connection.execute(text(f"EXPLAIN {LOOKUP_SQL}"), {"m": message_id})
        return str(next(iter(rows))[0]).strip()


def read_model_lookup(engine: Engine, item: Item) -> None:
    with engine.connect() as connection:
        found = connection.scalar(text(LOOKUP_SQL), {"m": item.message_id})
    if found != item.item_id:
        raise LookupError(item.message_id)


def service_lookup(engine: Engine, item: Item) -> None:
    """The query the report endpoint runs (`store.items_by_message_id`), for one report."""
    found = store.items_by_message_id(engine, DESTINATION, [item.message_id])
    if found.get(item.message_id, (None,))[0] != item.item_id:
        raise LookupError(item.message_id)


async def read_model_figures(engine: Engine, items: list[Item], picks: list[Item]) -> Any:
    """Fill the read model, then time both queries, each on a thread as the API runs them."""
    had_index = fill_read_model(engine, items)
    figures: dict[str, Any] = {
        "index_in_schema": had_index,
        "plan": query_plan(engine, picks[0].message_id),
    }
    for name, lookup in (("query", read_model_lookup), ("service_query", service_lookup)):
        for item in picks[:WARM_UP_LOOKUPS]:
            lookup(engine, item)
        calls = [functools.partial(asyncio.to_thread, lookup, engine, p) for p in picks]
        figures[name] = summary(await timed(calls))
        if name == "query":
            figures["query_back_to_back"] = summary(await timed(calls, rate=None))
    return figures


async def freshness(client: Client) -> dict[str, Any]:
    """From `start_workflow` returning (attribute set at start) until a list query finds it."""
    samples = []
    found_at_once = 0
    for _ in range(FRESHNESS_PROBES):
        item = new_item(f"fresh-{uuid.uuid4().hex[:12]}")
        await start_probe(client, item)
        started = time.perf_counter()
        polls = 1
        while await visibility_lookup(client, item.message_id) is None:
            await asyncio.sleep(FRESHNESS_POLL_S)
            polls += 1
        samples.append((time.perf_counter() - started) * 1000)
        found_at_once += polls == 1
    return {
        "probes": FRESHNESS_PROBES,
        "found_on_first_poll": found_at_once,
        **summary(samples),
    }


def new_item(key: str) -> Item:
    return Item(item_id=f"outbox/{OUTBOX}/{key}", message_id=str(uuid.uuid4()))


async def visibility_figures(scratch: Path, items: list[Item], picks: list[Item]) -> Any:
    """Dev server with the extra attribute; seed the probes, time lookups and freshness."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli_path(),
        dev_server_extra_args=[
            *dev_server_extra_args(scratch / "temporal.db"),
            "--search-attribute",
            f"{PROVIDER_MESSAGE_ID.name}=Keyword",
            "--log-level",
            "error",
        ],
    )
    # Stopping the server ends the probes with it: its database is a scratch file.
    async with env:
        started = time.perf_counter()
        await start_probes(env.client, items)
        seeded_s = time.perf_counter() - started
        await wait_until_visible(env.client, len(items))
        listed_s = time.perf_counter() - started
        for item in picks[:WARM_UP_LOOKUPS]:
            await found_by_visibility(env.client, item)
        lookups = [functools.partial(found_by_visibility, env.client, p) for p in picks]
        paced = summary(await timed(lookups))
        fresh = await freshness(env.client)
        back_to_back = await timed(lookups, rate=None)
        # Empty the limiter's burst bucket first, so the window measured sees its steady rate.
        await admitted_list_calls(env.client, picks[0].message_id, 1.0)
        limit = await admitted_list_calls(env.client, picks[0].message_id, RATE_LIMIT_WINDOW_S)
        return {
            "seed_start_s": round(seeded_s, 2),
            "seed_all_listed_s": round(listed_s, 2),
            "query": paced,
            "freshness": fresh,
            "query_back_to_back": {
                **summary(back_to_back),
                "max_ms": round(max(back_to_back), 1),
                "lookups_per_s": round(len(back_to_back) * 1000 / sum(back_to_back), 1),
            },
            "rate_limit": limit,
        }


async def postgres_figures(items: list[Item], picks: list[Item]) -> Any:
    """The read model in a throwaway schema of the shared database; None if it is unreachable."""
    schema = f"bench_report_lookup_{uuid.uuid4().hex[:8]}"
    admin = make_engine(POSTGRES_URL)
    try:
        with admin.begin() as connection:
            connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    except DBAPIError as err:
        admin.dispose()
        print(f"PostgreSQL at {POSTGRES_URL} unreachable ({type(err.orig).__name__}); skipped")
        return None
    # make_engine as the API has it (pool, pre-ping), confined to the schema by search_path.
    engine = make_engine(f"{POSTGRES_URL}?options=-csearch_path%3D{schema}")
    try:
        return await read_model_figures(engine, items, picks)
    finally:
        engine.dispose()
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


async def measure(item_count: int, lookup_count: int) -> dict[str, Any]:
    items = [new_item(f"order-{n:06d}") for n in range(item_count)]
    picks = random.choices(items, k=lookup_count)
    figures: dict[str, Any] = {"items": item_count, "lookups": lookup_count}
    with tempfile.TemporaryDirectory() as scratch:
        figures["search_attribute"] = await visibility_figures(Path(scratch), items, picks)
        sqlite = make_engine(f"sqlite:///{Path(scratch) / 'readmodel.db'}")
        try:
            figures["read_model_sqlite"] = await read_model_figures(sqlite, items, picks)
        finally:
            sqlite.dispose()
    postgres = await postgres_figures(items, picks)
    if postgres is not None:
        figures["read_model_postgres"] = postgres
    figures["freshness_variant"] = FRESHNESS_VARIANT
    figures["write_side"] = WRITE_SIDE
    return figures


def table(figures: dict[str, Any]) -> str:
    def row(label: str, stats: dict[str, float]) -> str:
        return (
            f"{label:<44}{stats['p50_ms']:>9}{stats['p95_ms']:>9}"
            f"{stats['p99_ms']:>9}{stats['mean_ms']:>9}"
        )

    visibility = figures["search_attribute"]
    fresh = visibility["freshness"]
    burst = visibility["query_back_to_back"]
    limit = visibility["rate_limit"]
    lines = [
        f"Finding an item by provider message id: {figures['items']} items,"
        f" {figures['lookups']} random lookups each way, {LOOKUP_RATE:g}/s unless noted",
        f"{'lookup':<44}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'mean ms':>9}",
        row("(a) visibility query, dev server (SQLite)", visibility["query"]),
        row("    same, back to back", burst)
        + f"   max {burst['max_ms']} ms, {burst['lookups_per_s']} lookups/s",
    ]
    plans = []
    for name, label in (("read_model_sqlite", "SQLite"), ("read_model_postgres", "PostgreSQL")):
        if name not in figures:
            lines.append(f"(b) read model, {label}: skipped (unreachable)")
            continue
        model = figures[name]
        lines.append(row(f"(b) read model, {label}", model["query"]))
        lines.append(row("    same, back to back", model["query_back_to_back"]))
        lines.append(row(f"    same, items_by_message_id, {label}", model["service_query"]))
        index = "in schema" if model["index_in_schema"] else "created here"
        plans.append(f"  {label} plan ({INDEX_NAME} {index}): {model['plan']}")
    lines.append(
        row(f"visibility freshness, start → findable ({fresh['probes']})", fresh)
        + f"   found on 1st poll: {fresh['found_on_first_poll']}/{fresh['probes']}"
    )
    lines += [
        f"  visibility rate limit: {limit['admitted_per_s']} list calls/s admitted back to back,"
        f" {limit['throttled_per_s']}/s refused RESOURCE_EXHAUSTED (the SDK retries them after"
        " about 1 s); the dev server sets frontend.namespaceRPS.visibility to 100/s, a"
        " self-hosted server's default is 10/s per frontend, Temporal Cloud has its own",
        *plans,
        f"  seeding: {figures['items']} starts in {visibility['seed_start_s']} s,"
        f" all listed after {visibility['seed_all_listed_s']} s",
        f"  freshness: {FRESHNESS_VARIANT}",
        f"Write side (a): {WRITE_SIDE['search_attribute']}.",
        f"Write side (b): {WRITE_SIDE['read_model']}.",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--lookups", type=int, default=300)
    args = parser.parse_args()
    started = time.perf_counter()
    figures = asyncio.run(measure(args.items, args.lookups))
    report = {"machine": machine(), **figures}
    report["elapsed_s"] = round(time.perf_counter() - started, 1)
    OUTPUT.parent.mkdir(exist_ok=True)
    OUTPUT.write_text(json.dumps(report, indent=2))
    print(table(figures))
    print(f"\n{report['elapsed_s']} s; written to {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
