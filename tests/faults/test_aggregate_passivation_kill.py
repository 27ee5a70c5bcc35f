"""Aggregates that end idle between bursts, on two workers, one SIGKILLed and started again
mid-way: every command lands exactly once, across the runs that end and the ones that load
what they stored (docs/decisions/aggregate-passivation.md)."""

from __future__ import annotations

import asyncio
import random
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from durable_outbox_temporal.aggregates import AggregateClient
from durable_outbox_temporal.contract.aggregate import CommandResult, aggregate_workflow_id
from temporalio.client import Client, WorkflowExecutionStatus

from readmodel import aggregates as event_store
from readmodel.db import make_engine
from tests.conftest import unique_name, webhook_destination
from tests.faults.test_faults import scrape, start_worker, worker_env, write_config
from tests.ports import free_port
from tests.workflows.test_aggregate_passivation import idle_after

ROUNDS = 16
CALLERS = 6
# Rounds before which the test waits for both flights' runs to have ended idle: one while both
# workers run, one after the kill (worker B alone), one after the restart. With the run that
# opens and the one the last burst ends, each flight has at least four runs.
ENDED_BEFORE = (2, ROUNDS // 3 + 1, 2 * ROUNDS // 3 + 1)


async def test_aggregates_ending_idle_on_two_workers_one_killed_lose_and_double_nothing(
    dev_env, fake_provider, tmp_path: Path
) -> None:
    config = tmp_path / "destinations.toml"
    write_config(config, webhook_destination(fake_provider))
    task_queue = unique_name("workflows")
    env = worker_env(dev_env, tmp_path, config, task_queue)
    # Runs end half a second after their last command: most pauses between rounds end one.
    client = AggregateClient(
        dev_env.client, task_queue, definitions=[idle_after("flight", timedelta(seconds=0.5))]
    )
    flights = [unique_name("BA") for _ in range(2)]
    seats = [f"{row}{letter}" for row in range(1, ROUNDS + 1) for letter in "ABCDEF"][
        : ROUNDS * CALLERS
    ]
    errors: list[str] = []
    jitter = random.Random(11)

    async def command(flight: str, name: str, payload: dict[str, Any], command_id: str) -> Any:
        """Its answer, asked again under its id after an error (no worker while one restarts)."""
        for _ in range(60):
            try:
                return await client.command("flight", flight, name, payload, command_id=command_id)
            except Exception as err:
                errors.append(type(err).__name__)
                await asyncio.sleep(0.5)
        raise AssertionError(f"command {command_id} never got an answer")

    def worker(name: str, metrics_address: str | None = None) -> Any:
        # Each worker its own metrics port.
        address = metrics_address or f"127.0.0.1:{free_port()}"
        own = {**env, "WORKER_METRICS_ADDRESS": address}
        return start_worker(own, tmp_path / f"worker-{name}.log")

    worker_b_metrics = f"127.0.0.1:{free_port()}"
    workers = [worker("a"), worker("b", worker_b_metrics)]
    try:
        for flight in flights:
            await command(flight, "open", {"seats": seats}, "open")
        for round_ in range(ROUNDS):
            if round_ == ROUNDS // 3:
                workers[0].send_signal(signal.SIGKILL)
                assert await asyncio.to_thread(workers[0].wait, 10) == -signal.SIGKILL
            if round_ == 2 * ROUNDS // 3:
                workers[0] = worker("a-again")
            if round_ in ENDED_BEFORE:
                # Here the runs surely end idle before the burst: the one after the kill on
                # worker B alone (it ends what the killed worker held and starts what comes
                # next), whatever the pauses elsewhere did on a loaded machine.
                await ended_idle(dev_env.client, flights)
            burst = [
                command(
                    flight,
                    "assign_seat",
                    {"seat": seats[n], "passenger_id": f"p{n}"},
                    f"c{n}",
                )
                for flight in flights
                for n in range(round_ * CALLERS, (round_ + 1) * CALLERS)
            ]
            answers: list[CommandResult] = await asyncio.wait_for(
                asyncio.gather(*burst), timeout=120
            )
            assert all(answer.version > 1 for answer in answers)
            await asyncio.sleep(jitter.uniform(0.6, 1.2))
        # The last burst's runs end idle too: a run's idle check may ring a moment past the
        # period (a loaded machine runs its timers and tasks late), so wait for it, up to a bound.
        await ended_idle(dev_env.client, flights)
        views = [await client.state("flight", flight) for flight in flights]
        metrics = await scrape(f"http://{worker_b_metrics}/metrics")
        runs = [
            len([run async for run in dev_env.client.list_workflows(f"WorkflowId = '{wid}'")])
            for wid in (aggregate_workflow_id("flight", flight) for flight in flights)
        ]
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()
    engine = make_engine(env["DATABASE_URL"])
    try:
        stored = [event_store.events(engine, "flight", flight, limit=500) for flight in flights]
        records = [event_store.get(engine, "flight", flight) for flight in flights]
    finally:
        engine.dispose()

    expected = {seat: f"p{n}" for n, seat in enumerate(seats)}
    for view, events, record in zip(views, stored, records, strict=True):
        assert view.state["seats"] == expected, errors[:20]
        assert view.version == len(seats) + 1
        assert [event.seq for event in events] == list(range(1, len(seats) + 2))
        assert sorted(event.command_id or "" for event in events[1:]) == sorted(
            f"c{n}" for n in range(len(seats))
        )
        assert record is not None and record.passivated_at is not None
    assert min(runs) >= 4, runs  # runs ended idle and were loaded again, many times
    # The worker that ran throughout counted its share of both (the other was killed).
    ended = sample(metrics, "outbox_aggregate_runs_ended", 'aggregate_type="flight"')
    resumed = sample(metrics, "outbox_aggregate_runs_resumed", 'source="carry"')
    assert ended >= 1 and resumed >= 1, metrics


async def ended_idle(client: Client, flights: list[str], limit_s: float = 30) -> None:
    """Until every flight's last run has ended (or `limit_s` passed: the assertions then say
    which did not). A run that ends idle completes; Temporal's own word, not the store's row (its
    `passivated_at` stays from an earlier run)."""
    handles = [client.get_workflow_handle(aggregate_workflow_id("flight", f)) for f in flights]
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        statuses = [(await handle.describe()).status for handle in handles]
        if all(status != WorkflowExecutionStatus.RUNNING for status in statuses):
            return
        await asyncio.sleep(0.1)


def sample(metrics: str, name: str, label: str) -> float:
    """The sum of a counter's samples carrying `label`."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.split("{")[0] == name and label in line
    )
