"""The generic aggregate workflow with the shipped definitions, on the time-skipping server."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from durable_outbox_temporal.aggregates import AggregateClient
from durable_outbox_temporal.errors import CommandConflict, InvalidCommand, UnknownCommand
from temporalio.client import WithStartWorkflowOperation
from temporalio.common import WorkflowIDConflictPolicy

from readmodel import aggregates as event_store
from tests.conftest import SEED_TYPES, unique_name

SEATS = {"seats": ["1A", "1B", "2A"]}


async def aggregates_on(stack: Any) -> AggregateClient:
    return AggregateClient(stack.client, stack.task_queue, definitions=SEED_TYPES.definitions)


async def test_commands_create_the_aggregate_and_append_events(stack_factory) -> None:
    stack = await stack_factory()
    client = await aggregates_on(stack)
    flight = unique_name("BA")

    opened = await client.command("flight", flight, "open", SEATS)
    seated = await client.command(
        "flight", flight, "assign_seat", {"seat": "1A", "passenger_id": "p1"}
    )
    moved = await client.command("flight", flight, "move_seat", {"passenger_id": "p1", "to": "2A"})
    view = await client.state("flight", flight)

    assert (opened.version, seated.version, moved.version) == (1, 2, 4)
    assert [e.type for e in moved.events] == ["SeatReleased", "SeatAssigned"]
    assert view.state == {"opened": True, "seats": {"1A": None, "1B": None, "2A": "p1"}}
    assert view.views == {"assignments": 2}
    for _ in range(50):
        stored = event_store.events(stack.engine, "flight", flight)
        if len(stored) == 4:
            break
        await asyncio.sleep(0.05)
    assert [(e.seq, e.type) for e in stored] == [
        (1, "FlightOpened"),
        (2, "SeatAssigned"),
        (3, "SeatReleased"),
        (4, "SeatAssigned"),
    ]
    record = event_store.get(stack.engine, "flight", flight)
    assert record is not None and record.version == 4 and record.state == view.state
    await stack.record_history(f"agg/flight/{flight}")


async def test_refusals_are_typed(stack_factory) -> None:
    stack = await stack_factory()
    client = await aggregates_on(stack)
    flight = unique_name("BA")
    await client.command("flight", flight, "open", SEATS)
    await client.command("flight", flight, "assign_seat", {"seat": "1A", "passenger_id": "p1"})

    with pytest.raises(CommandConflict, match="SeatTaken"):
        await client.command("flight", flight, "assign_seat", {"seat": "1A", "passenger_id": "p2"})
    with pytest.raises(InvalidCommand, match="UnknownSeat"):
        await client.command("flight", flight, "assign_seat", {"seat": "9Z", "passenger_id": "p2"})
    with pytest.raises(CommandConflict, match="expected version 1"):
        await client.command("flight", flight, "release_seat", {"seat": "1A"}, expected_version=1)
    with pytest.raises(UnknownCommand):
        await client.command("flight", flight, "board", {})
    with pytest.raises(InvalidCommand, match="passenger_id"):
        await client.command("flight", flight, "assign_seat", {"seat": "1A"})
    assert (await client.state("flight", flight)).version == 2


async def test_concurrent_commands_for_one_seat_serialise(stack_factory) -> None:
    stack = await stack_factory()
    client = await aggregates_on(stack)
    flight = unique_name("BA")
    await client.command("flight", flight, "open", SEATS)

    outcomes = await asyncio.gather(
        *(
            client.command("flight", flight, "assign_seat", {"seat": "1B", "passenger_id": f"p{n}"})
            for n in range(50)
        ),
        return_exceptions=True,
    )

    winners = [o for o in outcomes if not isinstance(o, Exception)]
    assert len(winners) == 1
    assert all(isinstance(o, CommandConflict) for o in outcomes if isinstance(o, Exception))
    view = await client.state("flight", flight)
    assert (
        view.version == 2 and view.state["seats"]["1B"] == winners[0].events[0].data["passenger_id"]
    )


async def test_signalled_commands_dedupe_and_refusals_are_logged(stack_factory) -> None:
    stack = await stack_factory()
    client = await aggregates_on(stack)
    flight = unique_name("BA")

    await client.send("flight", flight, "open", SEATS, command_id="c1")
    await client.send("flight", flight, "open", SEATS, command_id="c1")  # a repeat
    await client.send(
        "flight", flight, "assign_seat", {"seat": "1A", "passenger_id": "p1"}, command_id="c2"
    )
    await client.send(
        "flight", flight, "assign_seat", {"seat": "1A", "passenger_id": "p2"}, command_id="c3"
    )
    for _ in range(100):
        view = await client.state("flight", flight)
        if view.rejected:
            break
        await asyncio.sleep(0.05)
    rejected = await client.rejected("flight", flight)

    assert view.version == 2 and view.state["seats"]["1A"] == "p1"
    assert [(r.request.command_id, r.error_type) for r in rejected] == [("c3", "Conflict")]
    assert "SeatTaken" in rejected[0].message
    # An update with a command id already seen answers the first outcome, appends nothing.
    repeat = await client.command("flight", flight, "open", SEATS, command_id="c1")
    assert repeat.duplicate and repeat.events == [] and repeat.version == 1
    await stack.record_history(f"agg/flight/{flight}")


async def test_lock_lease_expires_on_a_durable_timer(stack_factory) -> None:
    stack = await stack_factory()
    client = await aggregates_on(stack)
    lock = unique_name("lock")

    await client.command("lock", lock, "acquire", {"holder": "h1", "ttl_s": 3600})
    with pytest.raises(CommandConflict, match="LockHeld"):
        await client.command("lock", lock, "acquire", {"holder": "h2", "ttl_s": 10})
    await client.command("lock", lock, "renew", {"holder": "h1", "ttl_s": 3600})
    await stack.env.sleep(timedelta(minutes=61))  # the server skips the hour

    view = await client.state("lock", lock)
    assert view.state == {"holder": None, "until": None}
    stored = event_store.events(stack.engine, "lock", lock)
    assert [e.type for e in stored][-1] == "LeaseExpired"
    assert stored[-1].actor == "timer"
    acquired = await client.command("lock", lock, "acquire", {"holder": "h2", "ttl_s": 10})
    assert acquired.events[0].type == "LockAcquired"
    # Released, the lock has no timer left: an open timer without a worker would stop the
    # server skipping time for later tests.
    await client.command("lock", lock, "release", {"holder": "h2"})
    await stack.record_history(f"agg/lock/{lock}")


async def test_continue_as_new_keeps_state_with_commands_in_flight(stack_factory, dev_env) -> None:
    # The dev server here suggests continue-as-new after 40 history events.
    stack = await stack_factory(env=dev_env)
    client = await aggregates_on(stack)
    # Clients of their own, as API processes would be: each batches its own commands, so the
    # aggregate takes several updates and signals at once, and some meet the hand-over.
    processes = [await aggregates_on(stack) for _ in range(6)]
    flight = unique_name("BA")
    seats = [f"{row}{letter}" for row in range(1, 41) for letter in "ABCDEF"]
    await client.command("flight", flight, "open", {"seats": seats})

    async def assign(n: int) -> Any:
        payload = {"seat": seats[n], "passenger_id": f"p{n}"}
        sender = processes[n % len(processes)]
        if n % 3 == 0:  # a third by signal, the rest by update
            return await sender.send("flight", flight, "assign_seat", payload, command_id=f"s{n}")
        return await sender.command("flight", flight, "assign_seat", payload, command_id=f"u{n}")

    # In waves, so the history grows past the suggestion while commands keep coming.
    try:
        for wave in range(0, len(seats), 60):
            await asyncio.gather(*(assign(n) for n in range(wave, wave + 60)))
    except Exception:
        async for run in stack.client.list_workflows(f"WorkflowId = 'agg/flight/{flight}'"):
            h = stack.client.get_workflow_handle(run.id, run_id=run.run_id)
            async for e in h.fetch_history_events():
                if e.event_type == 8:
                    print("WFTFAILED", e.workflow_task_failed_event_attributes)
        raise
    # A repeat of a command seen before the hand-over is still recognised after it.
    repeat = await client.command(
        "flight", flight, "assign_seat", {"seat": seats[1], "passenger_id": "p1"}, command_id="u1"
    )
    for _ in range(200):
        view = await client.state("flight", flight)
        if view.version == len(seats) + 1:
            break
        await asyncio.sleep(0.05)

    assert repeat.duplicate
    assert view.version == len(seats) + 1
    assert view.state["seats"] == {seat: f"p{n}" for n, seat in enumerate(seats)}
    assert view.views == {"assignments": len(seats)}
    runs = [run async for run in stack.client.list_workflows(f"WorkflowId = 'agg/flight/{flight}'")]
    assert len(runs) >= 2, "the aggregate never continued as new"
    for _ in range(100):
        stored = event_store.events(stack.engine, "flight", flight, limit=500)
        if len(stored) == len(seats) + 1:
            break
        await asyncio.sleep(0.05)
    assert [e.seq for e in stored] == list(range(1, len(seats) + 2))


async def test_commands_as_raw_json_from_any_client(stack_factory) -> None:
    """What a Go or TypeScript service sends: names and plain JSON, no Python types."""
    stack = await stack_factory()
    flight = unique_name("BA")
    workflow_id = f"agg/flight/{flight}"
    start = WithStartWorkflowOperation(
        "Aggregate",
        {"type": "flight", "id": flight},
        id=workflow_id,
        task_queue=stack.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )

    opened = await stack.client.execute_update_with_start_workflow(
        "command",
        {"name": "open", "payload": {"seats": ["1A", "1B"]}, "command_id": "raw-1"},
        start_workflow_operation=start,
    )
    handle = stack.client.get_workflow_handle(workflow_id)
    await handle.signal(
        "send_command",
        {
            "name": "assign_seat",
            "payload": {"seat": "1A", "passenger_id": "p1"},
            "command_id": "raw-2",
        },
    )
    state = await handle.query("state")

    assert opened["version"] == 1 and opened["events"][0]["type"] == "FlightOpened"
    assert state["version"] == 2 and state["state"]["seats"] == {"1A": "p1", "1B": None}
