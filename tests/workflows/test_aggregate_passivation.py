"""An idle aggregate's run stores what it carries and ends; the next command's run loads it
first (docs/decisions/aggregate-passivation.md): state, version, views, the dedupe window and the
rejected log outlive the run, on the time-skipping server; commands racing the end are neither
lost nor doubled, on the dev server."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from durable_outbox_temporal.aggregate_definition import AggregateDefinition
from durable_outbox_temporal.aggregates import AggregateClient
from durable_outbox_temporal.contract.aggregate import (
    AggregateCarry,
    PassivateAggregate,
    RecordedEvent,
    StoreEvents,
    is_shredded,
)
from durable_outbox_temporal.contract.aggregate import aggregate_workflow_id as workflow_id_of
from durable_outbox_temporal.errors import CommandConflict, UnknownAggregate, UnknownEffect
from temporalio.client import WorkflowExecutionStatus, WorkflowHistory
from temporalio.worker import Replayer

from readmodel import aggregates as event_store
from service.aggregates import AggregateService
from tests.conftest import SEED_TYPES, unique_name
from tests.workflows.test_effects import eventually
from worker import WORKFLOWS, SandboxCheckingOnce
from workflows.aggregate_types import host

SEATS = {"seats": ["1A", "1B", "2A"]}
DATA = Path(__file__).parent / "data"


def idle_after(aggregate_type: str, after: timedelta | None) -> AggregateDefinition[Any]:
    """The seed definition of the type with another `passivate_after` (the worker hosts the
    seed's: a run takes the value its start input carries)."""
    seed = SEED_TYPES.definitions[aggregate_type]
    return type(f"Idle{type(seed).__name__}", (type(seed),), {"passivate_after": after})()


def client_on(stack: Any, *definitions: AggregateDefinition[Any]) -> AggregateClient:
    return AggregateClient(stack.client, stack.task_queue, definitions=definitions)


async def status_of(stack: Any, workflow_id: str) -> WorkflowExecutionStatus | None:
    return (await stack.client.get_workflow_handle(workflow_id).describe()).status


async def test_an_idle_aggregate_ends_and_its_next_command_carries_on(stack_factory) -> None:
    stack = await stack_factory()
    client = client_on(stack, idle_after("flight", timedelta(minutes=10)))
    flight = unique_name("BA")
    workflow_id = workflow_id_of("flight", flight)
    await client.command("flight", flight, "open", SEATS)
    await client.command(
        "flight", flight, "assign_seat", {"seat": "1A", "passenger_id": "p1"}, command_id="s1"
    )
    await client.send(
        "flight", flight, "assign_seat", {"seat": "1A", "passenger_id": "p2"}, command_id="s2"
    )
    await eventually(lambda: _rejected(client, flight))
    first_run = (await stack.client.get_workflow_handle(workflow_id).describe()).run_id

    await stack.env.sleep(timedelta(minutes=11))

    assert await status_of(stack, workflow_id) == WorkflowExecutionStatus.COMPLETED
    record = event_store.get(stack.engine, "flight", flight)
    assert record is not None and record.passivated_at is not None and record.version == 2
    # A run ends idle only with no failed effect: there is none to retry.
    with pytest.raises(UnknownEffect, match="ended idle"):
        await client.retry_effect("flight", flight, f"flight:{flight}:2:ping")
    # The next command starts a new run, which loads the stored carry before deciding: the
    # command id is still remembered, the seat still taken, the version goes on.
    repeat = await client.command(
        "flight", flight, "assign_seat", {"seat": "1A", "passenger_id": "p1"}, command_id="s1"
    )
    assert repeat.duplicate and repeat.version == 2
    with pytest.raises(CommandConflict, match="SeatTaken"):
        await client.command("flight", flight, "assign_seat", {"seat": "1A", "passenger_id": "p3"})
    seated = await client.command(
        "flight", flight, "assign_seat", {"seat": "1B", "passenger_id": "p3"}
    )
    assert seated.version == 3 and [e.seq for e in seated.events] == [3]
    view = await client.state("flight", flight)
    assert view.state["seats"] == {"1A": "p1", "1B": "p3", "2A": None}
    assert view.views == {"assignments": 2} and view.rejected == 1
    assert [r.request.command_id for r in await client.rejected("flight", flight)] == ["s2"]
    second_run = (await stack.client.get_workflow_handle(workflow_id).describe()).run_id
    assert second_run != first_run
    await stack.record_history(workflow_id, "-resumed")
    await _record_run(stack, workflow_id, first_run)


async def _rejected(client: AggregateClient, flight: str) -> bool:
    return (await client.state("flight", flight)).rejected == 1


async def _record_run(stack: Any, workflow_id: str, run_id: str) -> None:
    from tests.conftest import record_history

    await record_history(stack.client, workflow_id, "-ended", run_id=run_id)


async def test_an_aggregate_with_a_timer_pending_stays_running_until_it_fired(
    stack_factory,
) -> None:
    stack = await stack_factory()
    client = client_on(stack, idle_after("lock", timedelta(minutes=10)))
    lock = unique_name("lock")
    workflow_id = workflow_id_of("lock", lock)
    await client.command("lock", lock, "acquire", {"holder": "h1", "ttl_s": 3600})

    await stack.env.sleep(timedelta(minutes=30))
    assert await status_of(stack, workflow_id) == WorkflowExecutionStatus.RUNNING

    await stack.env.sleep(timedelta(minutes=45))  # the lease expired at 60, idle from then
    assert await status_of(stack, workflow_id) == WorkflowExecutionStatus.COMPLETED
    view = await client.state("lock", lock)
    assert view.version == 2 and view.state.get("holder") is None
    # While the lease was pending, the run looked again once per idle period: one run, a
    # handful of events (a check that failed at once each time would spin until the history
    # forced a continue-as-new).
    events = [e async for e in stack.client.get_workflow_handle(workflow_id).fetch_history_events()]
    assert not events[0].workflow_execution_started_event_attributes.continued_execution_run_id
    assert len(events) < 100, len(events)
    await stack.record_history(workflow_id)


async def test_a_definition_may_keep_its_aggregates_running(stack_factory) -> None:
    stack = await stack_factory()
    client = client_on(stack, idle_after("flight", None))
    flight = unique_name("BA")
    await client.command("flight", flight, "open", SEATS)

    await stack.env.sleep(timedelta(hours=2))  # past the default hour

    assert await status_of(stack, workflow_id_of("flight", flight)) == (
        WorkflowExecutionStatus.RUNNING
    )


async def test_an_aggregate_erased_while_idle_refuses_commands(stack_factory) -> None:
    stack = await stack_factory()
    client = client_on(stack, idle_after("flight", timedelta(minutes=10)))
    flight = unique_name("BA")
    await client.command("flight", flight, "open", SEATS)
    await stack.env.sleep(timedelta(minutes=11))
    assert await status_of(stack, workflow_id_of("flight", flight)) == (
        WorkflowExecutionStatus.COMPLETED
    )

    event_store.erase(stack.engine, "flight", flight, datetime.now(UTC))

    with pytest.raises(CommandConflict, match="erased while idle") as refused:
        await client.command("flight", flight, "assign_seat", {"seat": "1A", "passenger_id": "p"})
    assert refused.value.reason == "AggregateErased"
    view = await client.state("flight", flight)
    assert view.version == 1 and is_shredded(view.state)
    await stack.record_history(workflow_id_of("flight", flight))


async def test_an_erased_aggregates_run_ends_where_it_would_continue_as_new(
    stack_factory, dev_env
) -> None:
    """An erased aggregate's run holds nothing to carry: where its history grows long (here the
    dev server suggests continue-as-new at 40 events) it ends, and the next command's run finds
    it erased again. Carried, its erased state would fail the next run at its start."""
    stack = await stack_factory(env=dev_env)
    client = client_on(stack, idle_after("flight", timedelta(seconds=0.5)))
    flight = unique_name("BA")
    workflow_id = workflow_id_of("flight", flight)
    await client.command("flight", flight, "open", SEATS)

    async def ended() -> bool:
        return await status_of(stack, workflow_id) == WorkflowExecutionStatus.COMPLETED

    await eventually(ended)
    event_store.erase(stack.engine, "flight", flight, datetime.now(UTC))

    for n in range(30):  # refused one by one, into the rejected log
        payload = {"seat": "1A", "passenger_id": f"p{n}"}
        await client.send("flight", flight, "assign_seat", payload, command_id=f"s{n}")

    with pytest.raises(CommandConflict, match="erased while idle"):
        await client.command("flight", flight, "assign_seat", {"seat": "1A", "passenger_id": "p"})
    view = await client.state("flight", flight)
    assert view.version == 1 and is_shredded(view.state)
    history = stack.client.get_workflow_handle(workflow_id).fetch_history_events()
    assert not [e async for e in history if e.workflow_task_failed_event_attributes.cause]


async def test_a_terminated_aggregate_resumes_from_its_stored_state(stack_factory) -> None:
    stack = await stack_factory()
    client = client_on(stack, idle_after("flight", timedelta(minutes=10)))
    flight = unique_name("BA")
    workflow_id = workflow_id_of("flight", flight)
    await client.command("flight", flight, "open", SEATS)
    await client.command("flight", flight, "assign_seat", {"seat": "1A", "passenger_id": "p1"})
    await eventually(lambda: _stored_at(stack, flight, 2))

    await stack.client.get_workflow_handle(workflow_id).terminate("an operator's mistake")

    seated = await client.command(
        "flight", flight, "assign_seat", {"seat": "1B", "passenger_id": "p2"}
    )
    assert seated.version == 3
    view = await client.state("flight", flight)
    assert view.state["seats"] == {"1A": "p1", "1B": "p2", "2A": None}
    assert view.views == {"assignments": 2}  # folded again from the stored events
    await stack.record_history(workflow_id)


async def _stored_at(stack: Any, flight: str, version: int) -> bool:
    record = event_store.get(stack.engine, "flight", flight)
    return record is not None and record.version == version


@pytest.mark.timeout(120)
async def test_commands_racing_the_end_of_runs_are_neither_lost_nor_doubled(
    stack_factory, dev_env
) -> None:
    """Runs end half a second after their last command while commands keep coming about as
    often, an update and a signal at once each time: each command lands exactly once, across
    many runs (an update the server aborted as its run ended goes again to the next run)."""
    stack = await stack_factory(env=dev_env)
    rows = range(1, 21)
    seats = [f"{row}{letter}" for row in rows for letter in "AB"]
    client = client_on(stack, idle_after("flight", timedelta(seconds=0.5)))
    flight = unique_name("BA")
    workflow_id = workflow_id_of("flight", flight)
    await client.command("flight", flight, "open", {"seats": seats})
    jitter = random.Random(7)

    for row in rows:
        await asyncio.sleep(jitter.uniform(0.3, 1.0))
        await asyncio.gather(
            client.command(
                "flight", flight, "assign_seat", {"seat": f"{row}A", "passenger_id": f"p{row}A"}
            ),
            client.send(
                "flight",
                flight,
                "assign_seat",
                {"seat": f"{row}B", "passenger_id": f"p{row}B"},
                command_id=f"{row}B",
            ),
        )

    async def all_seated() -> Any:
        view = await client.state("flight", flight)
        return view if view.version == 1 + len(seats) else None

    view = await eventually(all_seated)
    assert view.state["seats"] == {seat: f"p{seat}" for seat in seats}
    assert view.rejected == 0

    # The event store trails the run by a moment (its write follows the answer).
    async def all_stored() -> list[int] | None:
        stored = [e.seq for e in event_store.events(stack.engine, "flight", flight, limit=100)]
        return stored if len(stored) >= 1 + len(seats) else None

    assert await eventually(all_stored) == list(range(1, 2 + len(seats)))

    async def runs() -> int:
        listed = stack.client.list_workflows(f"WorkflowId = '{workflow_id}'")
        count = len([run async for run in listed])
        return count if count >= 5 else 0

    await eventually(runs)


async def test_an_ended_aggregate_temporal_forgot_is_read_from_the_store(stack_factory) -> None:
    """Past the namespace's retention Temporal no longer knows a run that ended idle: its
    state, views and effect ledger are read from what the run stored."""
    stack = await stack_factory()
    client = client_on(stack, idle_after("flight", timedelta(minutes=10)))
    flight = unique_name("BA")
    service = AggregateService(client, stack.engine)
    with pytest.raises(UnknownAggregate):
        await service.state("flight", flight)
    # What a run stores as it ends, with no workflow of that id in Temporal.
    event_store.store_events(stack.engine, opened(flight))
    carry = AggregateCarry(
        state=SEATED, version=1, views={"assignments": 0}, updated_at=T0, rejected=[]
    )
    assert event_store.passivate(
        stack.engine, PassivateAggregate("flight", flight, carry, passivated_at=T0)
    )

    view = await service.state("flight", flight)

    assert (view.version, view.state, view.views) == (1, SEATED, {"assignments": 0})
    assert view.effects == {"pending": 0, "done": 0, "failed": 0}
    assert await service.effects("flight", flight) == []


T0 = datetime(2026, 11, 30, 9, tzinfo=UTC)
SEATED = {"opened": True, "seats": {"1A": None}}


def opened(flight: str) -> StoreEvents:
    event = RecordedEvent(1, "FlightOpened", {"seats": ["1A"]}, T0)
    return StoreEvents("flight", flight, [event], 1, SEATED, T0)


async def test_an_idle_check_after_a_task_without_commands_replays() -> None:
    """A history recorded under the suite's load (the labour example on the time-skipping
    server): two effects completed in a task that sent no command (events 109-115), the next
    task came 92 ms later with nothing new, and an hour after, the run found itself idle since a
    period and 53 ms, stored itself and ended (a local activity, then the run's end). A replay
    takes a task that sent no command together with the next one, under the later task's time:
    measured from there, the run had been idle 39 ms short of the period, looked again instead
    of ending, and the replay failed on the stored-and-ended task (a nondeterminism error, which
    a worker that lost the run from its cache hits on its next task or query). Whether the run
    was active since its idle check was armed is a matter of the events' order, the same on
    the run and on its replay."""
    history = WorkflowHistory.from_json(
        "labour", (DATA / "aggregate_idle_after_a_task_without_commands.json").read_text()
    )
    host(SEED_TYPES.definitions)

    await Replayer(workflows=WORKFLOWS, workflow_runner=SandboxCheckingOnce()).replay_workflow(
        history
    )
