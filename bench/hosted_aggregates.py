"""Aggregates hosted several to a workflow, a design probe against one workflow per aggregate
(`python -m bench.hosted_aggregates`; docs/decisions/workflow-start-floor.md).

Not product code: `PrototypeHost` is the least a host of many aggregates must do to answer the
question the `aggregates_commands_per_s` bar asks (what several aggregates to a workflow would
give on these 2 cores), and nothing else of an aggregate (no signals, timers, effects, erasure,
passivation or hand-over). Each cell is the product's own `AggregateCell`
(`workflows/aggregate_cell.py`: state, version, views, dedupe window, unstored events, `decide`
-> append -> `evolve`, as an aggregate's own workflow runs it); the one update takes a batch of
commands to aggregates of one type, loads the cells it does not hold in one local activity and
stores the batch's events in another, with the read model's own functions
(`readmodel.aggregates.resume`, `store_events`: sealed under each aggregate's data key, as the
product writes them). A client sends through one `Mailbox` per host (`HOSTS` of them), an
aggregate's host a hash of its id.

The load is the spread half of the hot-aggregate scenario without the API: `FLIGHTS` new
flights, 30 callers, each flight opened then a seat taken, in rounds alternating with the
product's way (`AggregateClient.command`, a workflow per aggregate), on a dev server of its own
persisted to SQLite as `make dev` runs it, the workers in this process. Prints each round's
commands a second and CPU a command (the server's; this process's: workers and callers), and
fails unless every flight of both ways is stored with its two events at version 2.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
from durable_outbox_temporal.aggregate_definition import AggregateDefinition
from durable_outbox_temporal.aggregates import AggregateClient
from durable_outbox_temporal.contract.aggregate import (
    CommandRequest,
    ResumedAggregate,
    StoreEvents,
)
from durable_outbox_temporal.mailbox import Mailbox
from sqlalchemy import Engine, func, select
from temporalio import activity, workflow
from temporalio.client import Client, WithStartWorkflowOperation
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import Worker

from bench.run import cpu_seconds
from bench.start_cost import connect_when_up, own_dev_server
from readmodel import aggregates as event_store
from readmodel.db import create_schema, make_engine
from readmodel.models import AGGREGATES
from service.aggregate_types import load_aggregate_types
from worker import build_workers
from workflows.aggregate_cell import AggregateCell, Refused

HOSTS = int(os.environ.get("HOSTED_HOSTS", "4"))
FLIGHTS = int(os.environ.get("HOSTED_FLIGHTS", "300"))
ROUNDS = int(os.environ.get("HOSTED_ROUNDS", "2"))
CALLERS = 30
TYPES = load_aggregate_types("examples.flight:FLIGHT")
FLIGHT: AggregateDefinition[Any] = TYPES.definitions["flight"]
HOST_QUEUE = "hosted-aggregates-prototype"
PRODUCT_QUEUE = "hosted-aggregates-product"
# The read model the prototype's activities write: set once the run has made it.
_ENGINE: list[Engine] = []


@dataclass
class Addressed:
    id: str
    request: CommandRequest


@dataclass
class HostBatch:
    commands: list[Addressed]


@dataclass
class Outcome:
    version: int = 0
    duplicate: bool = False
    error: str | None = None


@dataclass
class HostOutcomes:
    outcomes: list[Outcome] = field(default_factory=list)


@activity.defn(name="prototype_load_aggregates")
async def load_aggregates(
    aggregate_type: str, ids: list[str]
) -> dict[str, ResumedAggregate | None]:
    def load() -> dict[str, ResumedAggregate | None]:
        return {i: event_store.resume(_ENGINE[0], aggregate_type, i) for i in ids}

    return await asyncio.to_thread(load)


@activity.defn(name="prototype_store_aggregates")
async def store_aggregates(batches: list[StoreEvents]) -> None:
    def write() -> None:
        for batch in batches:
            event_store.store_events(_ENGINE[0], batch)

    await asyncio.to_thread(write)


def _cell(aggregate_id: str, resumed: ResumedAggregate | None) -> AggregateCell:
    """A flight's cell, from what the read model holds of it (a new flight: nothing)."""
    cell = AggregateCell("flight", aggregate_id, FLIGHT)
    if resumed is not None and resumed.carry is not None:
        cell.take(resumed.carry)
    elif resumed is not None:
        cell.version, cell.state = resumed.version, FLIGHT.load_state(resumed.state)
    return cell


@workflow.defn(name="PrototypeAggregateHost", sandboxed=False)
class PrototypeHost:
    def __init__(self) -> None:
        self.cells: dict[str, AggregateCell] = {}
        self.to_load: set[str] = set()

    @workflow.run
    async def run(self, aggregate_type: str) -> None:
        while True:
            await workflow.wait_condition(
                lambda: bool(self.to_load) or any(c.unstored for c in self.cells.values())
            )
            if self.to_load:
                ids = sorted(self.to_load)
                loaded = await workflow.execute_local_activity(
                    load_aggregates,
                    args=[aggregate_type, ids],
                    start_to_close_timeout=timedelta(seconds=10),
                )
                for aggregate_id in ids:
                    self.cells[aggregate_id] = _cell(aggregate_id, loaded.get(aggregate_id))
                    self.to_load.discard(aggregate_id)
            pending = [(i, cell) for i, cell in self.cells.items() if cell.unstored]
            if pending:
                batches = [
                    StoreEvents(
                        type=aggregate_type,
                        id=aggregate_id,
                        events=list(cell.unstored),
                        version=cell.version,
                        state=cell.state_json(),
                        updated_at=cell.updated_at or workflow.now(),
                    )
                    for aggregate_id, cell in pending
                ]
                for _, cell in pending:
                    cell.unstored = []
                await workflow.execute_local_activity(
                    store_aggregates, batches, start_to_close_timeout=timedelta(seconds=10)
                )

    @workflow.update(name="prototype_commands")
    async def commands(self, batch: HostBatch) -> HostOutcomes:
        new = {c.id for c in batch.commands if c.id not in self.cells}
        if new:
            self.to_load |= new
            await workflow.wait_condition(lambda: all(i in self.cells for i in new))
        return HostOutcomes([self._apply(c) for c in batch.commands])

    def _apply(self, addressed: Addressed) -> Outcome:
        cell = self.cells[addressed.id]
        try:
            result = cell.apply(addressed.request)
        except Refused as refused:
            return Outcome(version=cell.version, error=f"{refused.error_type}: {refused}")
        return Outcome(version=result.version, duplicate=result.duplicate)


def host_of(aggregate_id: str, hosts: int) -> str:
    """The prototype host of an aggregate: a stable hash of its id over `hosts`."""
    digest = hashlib.blake2b(aggregate_id.encode(), digest_size=4).digest()
    return f"prototype-host/flight/{int.from_bytes(digest, 'big') % hosts}"


Call = Callable[[], Awaitable[Any]]


async def burst(calls: list[Call]) -> tuple[float, int]:
    """The calls, `CALLERS` at a time: seconds taken and calls that failed."""
    waiting = list(reversed(calls))
    failed = 0

    async def caller() -> None:
        nonlocal failed
        while waiting:
            call = waiting.pop()
            try:
                await call()
            except Exception as err:
                failed += 1
                print(f"    failed: {type(err).__name__}: {err}", flush=True)

    began = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(CALLERS)))
    return time.perf_counter() - began, failed


def stored_at_version_2(engine: Engine, prefix: str) -> int:
    """Flights named `prefix...` whose state row is at version 2 (opened, a seat taken)."""
    with engine.connect() as connection:
        found: int = connection.execute(
            select(func.count())
            .select_from(AGGREGATES)
            .where(
                AGGREGATES.c.type == "flight",
                AGGREGATES.c.id.startswith(prefix),
                AGGREGATES.c.version == 2,
            )
        ).scalar_one()
    return found


async def measure(client: Client, server_pid: int, engine: Engine) -> dict[str, list[float]]:
    product = AggregateClient(client, PRODUCT_QUEUE, definitions=[FLIGHT])

    async def send(host: str, items: list[Addressed]) -> list[Outcome]:
        result: HostOutcomes = await client.execute_update_with_start_workflow(
            "prototype_commands",
            HostBatch(items),
            start_workflow_operation=WithStartWorkflowOperation(
                PrototypeHost.run,
                "flight",
                id=host,
                task_queue=HOST_QUEUE,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            ),
            result_type=HostOutcomes,
        )
        return result.outcomes

    mailbox: Mailbox[Addressed, Outcome] = Mailbox(send, max_batch=100)

    def product_call(flight: str, name: str, payload: dict[str, Any]) -> Call:
        return lambda: product.command("flight", flight, name, payload, command_id=name)

    def hosted_call(flight: str, name: str, payload: dict[str, Any]) -> Call:
        async def call() -> None:
            request = CommandRequest(name=name, payload=payload, command_id=name)
            outcome = await mailbox.call(host_of(flight, HOSTS), Addressed(flight, request))
            if outcome.error:
                raise RuntimeError(outcome.error)

        return call

    ways = {"product": product_call, "hosted": hosted_call}
    rates: dict[str, list[float]] = {way: [] for way in ways}
    wrong = 0
    for round_ in range(ROUNDS):
        for way, make_call in ways.items():
            prefix = f"{way}-{uuid.uuid4().hex[:8]}-"
            flights = [f"{prefix}{n}" for n in range(FLIGHTS)]
            server_before, own_before = cpu_seconds(server_pid), cpu_seconds(os.getpid())
            opened, failed_opens = await burst(
                [make_call(f, "open", {"seats": ["1A"]}) for f in flights]
            )
            taken, failed_takes = await burst(
                [make_call(f, "assign_seat", {"seat": "1A", "passenger_id": "p"}) for f in flights]
            )
            server_ms = (cpu_seconds(server_pid) - server_before) * 1000 / (2 * FLIGHTS)
            own_ms = (cpu_seconds(os.getpid()) - own_before) * 1000 / (2 * FLIGHTS)
            stored = await asyncio.to_thread(stored_at_version_2, engine, prefix)
            wrong += failed_opens + failed_takes + (FLIGHTS - stored)
            rate = 2 * FLIGHTS / (opened + taken)
            rates[way].append(rate)
            print(
                f"  round {round_ + 1} {way}: {rate:.1f} commands a second (opens"
                f" {FLIGHTS / opened:.1f}, seat takings {FLIGHTS / taken:.1f} a second);"
                f" CPU a command: server {server_ms:.2f} ms, workers and callers {own_ms:.2f} ms;"
                f" {stored} of {FLIGHTS} stored at version 2",
                flush=True,
            )
    if wrong:
        raise SystemExit(f"{wrong} commands failed or flights not stored at version 2")
    return rates


async def main() -> None:
    async with AsyncExitStack() as exits:
        folder = Path(exits.enter_context(tempfile.TemporaryDirectory()))
        engine = make_engine(f"sqlite:///{folder / 'read-model.db'}")
        exits.callback(engine.dispose)
        create_schema(engine)
        _ENGINE.append(engine)
        address, server_pid = exits.enter_context(own_dev_server(folder / "temporal.db"))
        client = await connect_when_up(address)
        http = await exits.enter_async_context(httpx.AsyncClient())
        workers = build_workers(
            client,
            destinations=[],
            http_client=http,
            engine=engine,
            workflow_task_queue=PRODUCT_QUEUE,
            aggregate_types=TYPES,
        )
        workers.append(
            Worker(
                client,
                task_queue=HOST_QUEUE,
                workflows=[PrototypeHost],
                activities=[load_aggregates, store_aggregates],
            )
        )
        for worker in workers:
            await exits.enter_async_context(worker)
        print(f"{FLIGHTS} flights a round, {CALLERS} callers, {HOSTS} prototype hosts:", flush=True)
        rates = await measure(client, server_pid, engine)
    for way, measured in rates.items():
        print(f"{way}: median {statistics.median(measured):.1f} commands a second", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
