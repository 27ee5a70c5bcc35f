"""One hot aggregate under concurrent callers, the product against one update per command.

The product: 30 clients send `assign_seat` commands (each for its own seat) to one flight
through the API, which batches them (a mailbox per aggregate, one `commands` update at a time).
The baseline: the same 30 clients, each command one update-with-start from a raw Temporal client,
as the API did before batching. The two alternate in rounds, each round on a fresh flight. Then
60 clients over two API processes on one flight (state and event store must agree), one client
after another (the single-caller latency), and 30 clients spread over many aggregates.

A refused command is one answered 5xx (or not answered): what a caller is told to retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from durable_outbox_temporal.aggregates import AggregateClient
from durable_outbox_temporal.client import RPC_TIMEOUT as CLIENT_RPC_TIMEOUT
from durable_outbox_temporal.contract.aggregate import (
    COMMAND_SIGNAL,
    COMMAND_UPDATE,
    CommandRequest,
    CommandResult,
)
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WithStartWorkflowOperation
from temporalio.common import WorkflowIDConflictPolicy

from bench.actions import billable_actions, run_histories
from configuration.settings import get_settings
from readmodel.aggregates import MAX_PAGE as PAGE
from service.aggregate_types import load_aggregate_types

CLIENTS = 30
ROWS = "ABCDEF"
# The raw client's deadline per command: the API's.
RPC_TIMEOUT = CLIENT_RPC_TIMEOUT


def seats(count: int) -> list[str]:
    return [f"{row}{letter}" for row in range(1, count // len(ROWS) + 2) for letter in ROWS][:count]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1) if ordered else 0.0


class Run:
    """One burst's answers: latencies of the accepted, and how many were refused."""

    def __init__(self) -> None:
        self.latencies_ms: list[float] = []
        self.refused = 0
        self.other = 0
        self.seconds = 0.0

    def figures(self, prefix: str) -> dict[str, Any]:
        done = len(self.latencies_ms)
        return {
            f"{prefix}_commands_per_s": round(done / self.seconds, 1) if self.seconds else 0.0,
            f"{prefix}_p50_ms": percentile(self.latencies_ms, 0.5),
            f"{prefix}_p99_ms": percentile(self.latencies_ms, 0.99),
            f"{prefix}_refused": self.refused,
            # Answered 4xx: a wrong answer for these commands, each of which should succeed.
            f"{prefix}_wrong_answers": self.other,
        }


class Connection:
    """One keep-alive HTTP/1.1 connection that POSTs JSON and reads the status: the load
    generator shares the cores with the stack, so it must cost little CPU per request, far less
    than httpx (why: docs/decisions/aggregate-command-batches.md)."""

    def __init__(self, api: str) -> None:
        url = httpx.URL(api)
        self._host, self._port = url.host, url.port or 80
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> int:
        if self._streams is None:
            self._streams = await asyncio.open_connection(self._host, self._port)
        reader, writer = self._streams
        head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {self._host}\r\nContent-Type: application/json\r\n"
            f"{head}Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        try:
            status_line = await reader.readline()
            status = int(status_line.split()[1])
            length, closing = 0, False
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                if name.lower() == "content-length":
                    length = int(value)
                elif name.lower() == "connection" and value.strip().lower() == "close":
                    closing = True
            await reader.readexactly(length)
        except (OSError, IndexError, ValueError, asyncio.IncompleteReadError):
            self.close()
            return 599
        if closing:
            self.close()
        return status

    def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None


# A command as one caller sends it, over that caller's own connections.
Send = Callable[[dict[str, "Connection"]], Awaitable[int]]


async def burst(clients: int, commands: list[Send], run: Run) -> None:
    """`clients` callers, each taking the next command when its last one is answered."""
    queue = list(reversed(commands))

    async def caller() -> None:
        connections: dict[str, Connection] = {}
        while queue:
            command = queue.pop()
            began = time.perf_counter()
            status = await command(connections)
            if status < 300:
                run.latencies_ms.append((time.perf_counter() - began) * 1000)
            elif status >= 500:
                run.refused += 1
            else:
                run.other += 1
        for connection in connections.values():
            connection.close()

    began = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(clients)))
    run.seconds += time.perf_counter() - began


def through_api(api: str, flight: str, name: str, payload: Any, key: str) -> Send:
    path = f"/v1/aggregates/flight/{flight}/commands/{name}"
    body = json.dumps(payload).encode()

    async def send(connections: dict[str, Connection]) -> int:
        connection = connections.setdefault(api, Connection(api))
        return await connection.post(path, body, {"Idempotency-Key": key})

    return send


def seat_takers(apis: list[str], flight: str, count: int) -> list[Send]:
    """`count` commands, each taking its own seat for its own passenger, spread over `apis`."""
    return [
        through_api(
            apis[n % len(apis)],
            flight,
            "assign_seat",
            {"seat": seat, "passenger_id": f"p{n}"},
            f"{flight}-{n}",
        )
        for n, seat in enumerate(seats(count))
    ]


def one_update_each(client: Client, task_queue: str, flight: str, payload: Any, key: str) -> Send:
    """Today's design before batching: one update-with-start per command."""

    async def send(_: dict[str, Connection]) -> int:
        start: WithStartWorkflowOperation[Any, Any] = WithStartWorkflowOperation(
            "Aggregate",
            {"type": "flight", "id": flight},
            id=f"agg/flight/{flight}",
            task_queue=task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        try:
            await client.execute_update_with_start_workflow(
                COMMAND_UPDATE,
                CommandRequest(name="assign_seat", payload=payload, command_id=key),
                start_workflow_operation=start,
                result_type=CommandResult,
                rpc_timeout=RPC_TIMEOUT,
            )
        except Exception:
            # The start's outcome is left unread when the update fails: read it, so the SDK's
            # future does not report an unretrieved exception.
            with contextlib.suppress(Exception):
                await start.workflow_handle()
            return 503
        return 200

    return send


# A 503 (Temporal or the database missed the API's deadline) is retried as a caller would, after
# its Retry-After: the full run of 2026-11-29 12:22 ended this scenario on a 503 from the API on
# a starved machine.
TRIES_ON_503 = 5


async def answered(call: Callable[[], Awaitable[httpx.Response]]) -> httpx.Response:
    """The API's answer to `call`, made again after a 503 (up to `TRIES_ON_503` times); any
    other error status raises."""
    for tries_left in reversed(range(TRIES_ON_503)):
        response = await call()
        if response.status_code != 503 or not tries_left:
            break
        await asyncio.sleep(float(response.headers.get("Retry-After", "1")))
    response.raise_for_status()
    return response


async def open_flight(http: httpx.AsyncClient, api: str, flight: str, count: int) -> None:
    await answered(
        lambda: http.post(
            f"{api}/v1/aggregates/flight/{flight}/commands/open",
            json={"seats": seats(count)},
            headers={"Idempotency-Key": f"open-{flight}"},
        )
    )


async def actions_per_command(client: Client, workflow_id: str, commands: int) -> float:
    """Billable actions of every run of one aggregate, per command it took."""
    runs = await run_histories(client, workflow_id)
    return round(sum(billable_actions(events) for events in runs) / commands, 3)


async def agrees_with_event_store(
    http: httpx.AsyncClient, api: str, flight: str
) -> tuple[bool, int]:
    """The live version and the stored events (dense, once each) agree; the version."""
    state = (await answered(lambda: http.get(f"{api}/v1/aggregates/flight/{flight}"))).json()
    version = int(state["version"])
    stored: list[int] = []
    for _ in range(100):
        stored, after = [], 0
        while True:
            page = await answered(
                functools.partial(
                    http.get,
                    f"{api}/v1/aggregates/flight/{flight}/events",
                    params={"after": after, "limit": PAGE},
                )
            )
            events = page.json()
            stored += [event["seq"] for event in events]
            if len(events) < PAGE:
                break
            after = events[-1]["seq"]
        if len(stored) >= version:
            break
        await asyncio.sleep(0.1)
    return stored == list(range(1, version + 1)), version


async def hot_aggregate(
    apis: list[str],
    client: Client,
    task_queue: str,
    cpu_seconds: Callable[[], dict[str, float]],
    *,
    quick: bool,
) -> dict[str, Any]:
    """`cpu_seconds`: each process's CPU so far, by name (the product's cost per command)."""
    figures: dict[str, Any] = {}
    commands = 1000
    # The baseline's rate needs no more: at about one command a second (most refused at
    # Temporal's 10 updates in flight, each retried after its deadline) 1,000 took ten minutes
    # a round and kept the full run from finishing in a session.
    naive_commands = 300
    rounds = 1 if quick else 2
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=100)
    async with httpx.AsyncClient(limits=limits, timeout=30) as http:
        api = apis[0]
        product, naive = Run(), Run()
        cpu_ms: dict[str, float] = {}
        product_flights = []
        for round_ in range(rounds):
            flight = f"hot-{uuid.uuid4().hex[:8]}"
            product_flights.append(flight)
            await open_flight(http, api, flight, commands)
            cpu_before = cpu_seconds()
            await burst(
                CLIENTS,
                seat_takers([api], flight, commands),
                product,
            )
            cpu_after = cpu_seconds()
            for name, seconds in cpu_after.items():
                cpu_ms[name] = cpu_ms.get(name, 0.0) + (seconds - cpu_before[name]) * 1000
            print(f"  round {round_ + 1} product: {product.figures('hot_aggregate')}", flush=True)
            flight = f"naive-{uuid.uuid4().hex[:8]}"
            await open_flight(http, api, flight, naive_commands)
            await burst(
                CLIENTS,
                [
                    one_update_each(
                        client,
                        task_queue,
                        flight,
                        {"seat": seat, "passenger_id": f"p{n}"},
                        f"{flight}-{n}",
                    )
                    for n, seat in enumerate(seats(naive_commands))
                ],
                naive,
            )
            print(f"  round {round_ + 1} naive: {naive.figures('naive_hot_aggregate')}", flush=True)
        figures.update(product.figures("hot_aggregate"))
        figures.update(naive.figures("naive_hot_aggregate"))
        figures["hot_aggregate_cpu_ms_per_command"] = {
            name: round(ms / (commands * rounds), 2) for name, ms in cpu_ms.items()
        }
        figures["hot_aggregate_actions_per_command"] = await actions_per_command(
            client, f"agg/flight/{product_flights[0]}", commands + 1
        )
        figures["naive_hot_aggregate_actions_per_command"] = await actions_per_command(
            client, f"agg/flight/{flight}", naive_commands + 1
        )

        # 60 clients over two API processes, one flight: none refused, store and state agree.
        two = Run()
        flight = f"two-{uuid.uuid4().hex[:8]}"
        await open_flight(http, api, flight, commands)
        await burst(
            60,
            seat_takers(apis, flight, commands),
            two,
        )
        agreed, version = await agrees_with_event_store(http, api, flight)
        figures.update(two.figures("two_api_hot_aggregate"))
        figures["two_api_hot_aggregate_consistent"] = agreed and version == commands + 1

        # One caller after another: what a single command costs.
        single = Run()
        flight = f"one-{uuid.uuid4().hex[:8]}"
        await open_flight(http, api, flight, 100)
        await burst(
            1,
            seat_takers([api], flight, 100),
            single,
        )
        figures["single_client_command_p50_ms"] = percentile(single.latencies_ms, 0.5)

        # 30 clients over many aggregates: each opened, then a seat taken.
        spread = Run()
        flights = [f"many-{uuid.uuid4().hex[:8]}" for _ in range(300 if quick else 1000)]
        work = []
        for flight in flights:
            work.append(through_api(api, flight, "open", {"seats": ["1A"]}, f"o-{flight}"))
        cpu_before = cpu_seconds()
        await burst(CLIENTS, work, spread)
        work = [
            through_api(
                api, flight, "assign_seat", {"seat": "1A", "passenger_id": "p"}, f"a-{flight}"
            )
            for flight in flights
        ]
        await burst(CLIENTS, work, spread)
        cpu_after = cpu_seconds()
        # Where a spread command's time goes: each process's CPU per command (an open starts
        # its aggregate's workflow, then a seat is taken in it).
        figures["aggregates_cpu_ms_per_command"] = {
            name: round((seconds - cpu_before[name]) * 1000 / (2 * len(flights)), 2)
            for name, seconds in cpu_after.items()
        }
        figures["aggregates_commands_per_s"] = spread.figures("spread")["spread_commands_per_s"]
        figures["aggregates_refused"] = spread.refused
    print("  signalled commands to one aggregate:", flush=True)
    figures.update(await signal_burst(client, task_queue, 2000 if quick else 10000))
    figures["hot_aggregate_ratio_vs_naive"] = (
        round(
            figures["hot_aggregate_commands_per_s"] / figures["naive_hot_aggregate_commands_per_s"],
            1,
        )
        if figures["naive_hot_aggregate_commands_per_s"]
        else None
    )
    print(f"  {figures}", flush=True)
    return figures


async def signal_burst(client: Client, task_queue: str, count: int) -> dict[str, Any]:
    """`count` signalled commands to one aggregate (a lock's holder renewing its lease) from 30
    callers: through `AggregateClient` (batched into `send_commands` signals) and as one raw
    `send_command` signal each. Figures: commands applied per second (until the state shows
    them all), refused signals, and the signals and runs the aggregate took."""
    figures: dict[str, Any] = {}
    aggregates = AggregateClient(
        client,
        task_queue,
        definitions=load_aggregate_types(get_settings().aggregate_types).definitions,
    )
    for kind in ("batched", "raw"):
        lock = f"signals-{kind}-{uuid.uuid4().hex[:8]}"
        await aggregates.command("lock", lock, "acquire", {"holder": "h", "ttl_s": 3600})
        run = Run()

        def renew(n: int, lock: str = lock, kind: str = kind) -> Send:
            payload = {"holder": "h", "ttl_s": 3600}

            async def send(_: dict[str, Connection]) -> int:
                try:
                    if kind == "batched":
                        await aggregates.send("lock", lock, "renew", payload, command_id=f"r{n}")
                    else:
                        await client.get_workflow_handle(f"agg/lock/{lock}").signal(
                            COMMAND_SIGNAL,
                            CommandRequest(name="renew", payload=payload, command_id=f"r{n}"),
                            rpc_timeout=RPC_TIMEOUT,
                        )
                except Exception:
                    return 503
                return 200

            return send

        began = time.perf_counter()
        await burst(CLIENTS, [renew(n) for n in range(count)], run)
        version = 0
        for _ in range(1200):
            version = (await aggregates.state("lock", lock)).version
            if version >= count + 1 - run.refused:
                break
            await asyncio.sleep(0.1)
        seconds = time.perf_counter() - began
        runs = await run_histories(client, f"agg/lock/{lock}")
        signals = sum(
            event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
            for events in runs
            for event in events
        )
        # The lease timer goes with the release: nothing is left waiting.
        await aggregates.command("lock", lock, "release", {"holder": "h"})
        figures[f"{kind}_signal_commands_per_s"] = round((version - 1) / seconds, 1)
        figures[f"{kind}_signal_refused"] = run.refused
        figures[f"{kind}_signal_applied"] = version - 1
        figures[f"{kind}_signals"] = signals
        figures[f"{kind}_signal_runs"] = len(runs)
        print(f"    {kind}: {version - 1} of {count} in {seconds:.1f} s", flush=True)
    return figures
