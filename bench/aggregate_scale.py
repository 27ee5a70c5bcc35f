"""`make chaos` part three (or `python -m bench.aggregate_scale`): 100,000 commands to ONE
aggregate (10,000 with QUICK=1), none lost, refused or applied twice.

Starts its own dev server (in-memory, Temporal's default limits), the workers and two
`AggregateClient`s in this process (two API processes, as far as the aggregate can tell). Thirty
callers, each owning one seat of one flight, take and release their seat in turn, so every
command appends exactly one event; a caller that sees an error sends the same command again
with its command id. The aggregate continues as new many times on the way (after 1,000 updates
in a run, or when Temporal suggests it), with commands arriving during each hand-over. Then: the
version counts every command once, the event store holds each command's event exactly once with
dense sequence numbers, and no caller was refused. Writes `.bench/aggregate_scale.json`; exits 1
on any loss, duplicate, refusal or gap.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections import Counter
from contextlib import AsyncExitStack
from typing import Any

from durable_outbox_temporal.aggregates import AggregateClient
from durable_outbox_temporal.contract.aggregate import RecordedEvent
from sqlalchemy import Engine

from bench.run import machine
from bench.stack import webhook_stack
from bench.verdict import verdict
from configuration.settings import PROJECT_ROOT, get_settings
from readmodel import aggregates as event_store
from readmodel.aggregates import MAX_PAGE
from service.aggregate_types import load_aggregate_types

QUICK = os.environ.get("QUICK") == "1"
COMMANDS = int(os.environ.get("AGGREGATE_COMMANDS") or (10_000 if QUICK else 100_000))
CALLERS = 30
PROCESSES = 2
RESULT = PROJECT_ROOT / ".bench" / "aggregate_scale.json"
TASK_QUEUE = "aggregate-scale-workflows"


def all_events(engine: Engine, flight: str) -> list[RecordedEvent]:
    """The flight's whole stored history, page by page."""
    events: list[RecordedEvent] = []
    while page := event_store.events(
        engine, "flight", flight, after=events[-1].seq if events else 0, limit=MAX_PAGE
    ):
        events += page
    return events


async def run() -> tuple[dict[str, Any], list[str]]:
    problems: list[str] = []
    async with AsyncExitStack() as exits:
        stack = await webhook_stack(
            exits,
            name="aggregate-scale-webhook",
            db_file=PROJECT_ROOT / ".bench" / "aggregate_scale.db",
            workflow_task_queue=TASK_QUEUE,
        )
        client = stack.env.client
        definitions = load_aggregate_types(get_settings().aggregate_types).definitions
        processes = [
            AggregateClient(client, TASK_QUEUE, definitions=definitions) for _ in range(PROCESSES)
        ]
        flight = f"scale-{int(time.time())}"
        seats = [f"{row}{letter}" for row in range(1, 6) for letter in "ABCDEF"][:CALLERS]
        await processes[0].command("flight", flight, "open", {"seats": seats})
        per_caller = COMMANDS // CALLERS
        errors: Counter[str] = Counter()

        async def caller(c: int) -> None:
            aggregates = processes[c % PROCESSES]
            for i in range(per_caller):
                # Even: take the seat; odd: give it back. Each changes the state: one event.
                name, payload = (
                    ("assign_seat", {"seat": seats[c], "passenger_id": f"p{c}"})
                    if i % 2 == 0
                    else ("release_seat", {"seat": seats[c]})
                )
                for _ in range(100):
                    try:
                        await aggregates.command(
                            "flight", flight, name, payload, command_id=f"c{c}-{i}"
                        )
                        break
                    except Exception as err:
                        errors[type(err).__name__] += 1
                        await asyncio.sleep(0.2)
                else:
                    problems.append(f"caller {c} gave up on command {i}")
                    return

        began = time.monotonic()
        await asyncio.gather(*(caller(c) for c in range(CALLERS)))
        elapsed = time.monotonic() - began
        expected = per_caller * CALLERS
        view = await processes[0].state("flight", flight)
        stored: list[Any] = []
        for _ in range(600):
            stored = all_events(stack.engine, flight)
            if len(stored) >= view.version:
                break
            await asyncio.sleep(0.1)
        runs = 0
        async for _ in client.list_workflows(f"WorkflowId = 'agg/flight/{flight}'"):
            runs += 1
    if view.version != expected + 1:
        problems.append(f"version {view.version}, expected {expected + 1}")
    if [event.seq for event in stored] != list(range(1, len(stored) + 1)):
        problems.append("the event store's sequence numbers have gaps or repeats")
    command_ids = Counter(event.command_id for event in stored[1:])
    if len(stored) - 1 != expected or len(command_ids) != expected:
        problems.append(
            f"{len(stored) - 1} stored events for {len(command_ids)} command ids, {expected} sent"
        )
    if any(count > 1 for count in command_ids.values()):
        problems.append("a command was applied twice")
    if errors:
        problems.append(f"callers were refused or timed out: {dict(errors)}")
    if runs < 2:
        problems.append("the aggregate never continued as new")
    report = {
        **machine(),
        "mode": "quick" if QUICK else "full",
        "commands": expected,
        "callers": CALLERS,
        "client_processes": PROCESSES,
        "elapsed_s": round(elapsed, 1),
        "commands_per_s": round(expected / elapsed, 1),
        "version": view.version,
        "stored_events": len(stored),
        "runs": runs,
        "errors": dict(errors),
        "problems": problems,
    }
    return report, problems


def main() -> int:
    report, problems = asyncio.run(run())
    return verdict("AGGREGATE SCALE", report, problems, RESULT)


if __name__ == "__main__":
    sys.exit(main())
