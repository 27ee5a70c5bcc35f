"""A worker SIGKILLed during a burst of commands on one aggregate: every caller gets its answer
(retrying with its command id after an error, as the API's callers may), and every command is
applied exactly once: the seat map is whole, the version and the event store dense."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

from durable_outbox_temporal.aggregates import AggregateClient
from durable_outbox_temporal.contract.aggregate import CommandResult

from readmodel import aggregates as event_store
from readmodel.db import make_engine
from tests.conftest import SEED_TYPES, unique_name, webhook_destination
from tests.faults.test_faults import start_worker, worker_env, write_config

CALLERS = 300


async def test_worker_killed_mid_burst_loses_and_doubles_no_command(
    dev_env, fake_provider, tmp_path: Path
) -> None:
    config = tmp_path / "destinations.toml"
    write_config(config, webhook_destination(fake_provider))
    task_queue = unique_name("workflows")
    env = worker_env(dev_env, tmp_path, config, task_queue)
    client = AggregateClient(dev_env.client, task_queue, definitions=SEED_TYPES.definitions)
    flight = unique_name("BA")
    seats = [f"{row}{letter}" for row in range(1, 51) for letter in "ABCDEF"][:CALLERS]
    log = tmp_path / "worker.log"
    answered = 0
    a_fifth_answered = asyncio.Event()
    errors: list[str] = []

    async def command(name: str, payload: dict[str, Any], command_id: str) -> CommandResult:
        """Its answer, asked again under its id after an error: Temporal's deadline while no
        worker runs (killed, or a new one still starting on a busy machine)."""
        for _ in range(60):
            try:
                return await client.command("flight", flight, name, payload, command_id=command_id)
            except Exception as err:
                errors.append(type(err).__name__)
                await asyncio.sleep(0.5)
        raise AssertionError(f"command {command_id} never got an answer")

    async def caller(n: int) -> CommandResult:
        nonlocal answered
        result = await command("assign_seat", {"seat": seats[n], "passenger_id": f"p{n}"}, f"c{n}")
        answered += 1
        if answered >= CALLERS // 5:
            a_fifth_answered.set()
        return result

    worker = start_worker(env, log)
    try:
        await command("open", {"seats": seats}, "open")
        callers = [asyncio.create_task(caller(n)) for n in range(CALLERS)]
        await a_fifth_answered.wait()
        worker.send_signal(signal.SIGKILL)
        assert await asyncio.to_thread(worker.wait, 10) == -signal.SIGKILL
        killed_at = answered
        worker = start_worker(env, log)
        results = await asyncio.wait_for(asyncio.gather(*callers), timeout=150)
        view = await client.state("flight", flight)
    finally:
        worker.kill()
        worker.wait()
    engine = make_engine(env["DATABASE_URL"])
    for _ in range(100):
        stored = event_store.events(engine, "flight", flight, limit=1000)
        if len(stored) >= view.version:
            break
        await asyncio.sleep(0.1)
    engine.dispose()

    assert killed_at < CALLERS, "the burst ended before the kill"
    assert view.state["seats"] == {seat: f"p{n}" for n, seat in enumerate(seats)}
    assert view.version == CALLERS + 1, errors[:20]  # what callers saw meanwhile
    # A caller retried after an error may find its command applied already: a duplicate,
    # answered with the version its first run left, never a second event.
    fresh = [result.version for result in results if not result.duplicate]
    repeats = [result.version for result in results if result.duplicate]
    assert len(set(fresh + repeats)) == CALLERS
    assert [event.seq for event in stored] == list(range(1, CALLERS + 2))
    assert sorted(event.command_id or "" for event in stored[1:]) == sorted(
        f"c{n}" for n in range(CALLERS)
    )
