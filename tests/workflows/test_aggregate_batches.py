"""Commands in batches: one `commands` update (or `send_commands` signal) carries many, each
decided on its own in arrival order; a client's concurrent callers share updates, so one
aggregate takes any number of callers within Temporal's 10 updates in flight."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from durable_outbox_temporal.aggregates import AggregateClient
from durable_outbox_temporal.contract.aggregate import (
    COMMANDS_UPDATE,
    CommandBatch,
    CommandBatchResult,
    CommandRequest,
)
from durable_outbox_temporal.errors import InvalidCommand
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WithStartWorkflowOperation
from temporalio.common import WorkflowIDConflictPolicy

from bench.actions import run_histories
from readmodel import aggregates as event_store
from tests.conftest import SEED_TYPES, unique_name


def assign(seat: str, passenger: str, command_id: str | None = None) -> CommandRequest:
    return CommandRequest(
        name="assign_seat",
        payload={"seat": seat, "passenger_id": passenger},
        command_id=command_id,
    )


async def send_batch(
    client: Client, task_queue: str, flight: str, commands: list[CommandRequest]
) -> CommandBatchResult:
    """The raw `commands` update, as any client may send it."""
    start = WithStartWorkflowOperation(
        "Aggregate",
        {"type": "flight", "id": flight},
        id=f"agg/flight/{flight}",
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    result: CommandBatchResult = await client.execute_update_with_start_workflow(
        COMMANDS_UPDATE,
        CommandBatch(commands=commands),
        start_workflow_operation=start,
        result_type=CommandBatchResult,
    )
    return result


async def history_counts(client: Client, workflow_id: str) -> Counter[int]:
    """Event types over every run of a workflow."""
    runs = await run_histories(client, workflow_id)
    return Counter(event.event_type for events in runs for event in events)


async def test_each_command_in_a_batch_is_decided_on_the_state_the_one_before_left(
    stack_factory,
) -> None:
    stack = await stack_factory()
    flight = unique_name("BA")
    open_ = CommandRequest(name="open", payload={"seats": ["1A", "1B", "2A"]}, command_id="o")

    first = await send_batch(
        stack.client,
        stack.task_queue,
        flight,
        [
            open_,
            assign("1A", "p1", "c1"),
            assign("1A", "p2", "c2"),  # 1A was taken by the command before it
            CommandRequest(name="board", payload={}),  # no such command
            assign("9Z", "p3"),  # no such seat
            assign("1B", "p3", "c3"),
            assign("1A", "p1", "c1"),  # a repeat inside the batch
        ],
    )
    # A repeat in a later batch answers the first outcome; expected_version still holds; the
    # id with another payload is refused.
    second = await send_batch(
        stack.client,
        stack.task_queue,
        flight,
        [
            assign("1B", "p3", "c3"),
            assign("2A", "p9", "c3"),
            CommandRequest(
                name="release_seat", payload={"seat": "1B"}, command_id="r", expected_version=2
            ),
            CommandRequest(
                name="release_seat", payload={"seat": "1B"}, command_id="r2", expected_version=3
            ),
        ],
    )
    state = await stack.client.get_workflow_handle(f"agg/flight/{flight}").query("state")

    outcomes = first.outcomes
    assert [o.result.version if o.result else o.error_type for o in outcomes] == [
        1,
        2,
        "Conflict",
        "UnknownCommand",
        "InvalidCommand",
        3,
        2,
    ]
    assert outcomes[1].result and outcomes[1].result.events[0].seq == 2
    assert outcomes[2].message and "1A" in outcomes[2].message
    assert outcomes[6].result and outcomes[6].result.duplicate and not outcomes[6].result.events
    repeat, reused, stale, released = second.outcomes
    assert repeat.result and repeat.result.duplicate and repeat.result.version == 3
    assert reused.error_type == "IdempotencyConflict" and "'c3'" in (reused.message or "")
    assert stale.error_type == "Conflict" and "expected version 2" in (stale.message or "")
    assert released.result and released.result.version == 4
    assert state["version"] == 4
    assert state["state"]["seats"] == {"1A": "p1", "1B": None, "2A": None}


async def test_a_batch_over_the_limit_is_refused_whole(stack_factory) -> None:
    stack = await stack_factory()
    flight = unique_name("BA")
    await send_batch(
        stack.client,
        stack.task_queue,
        flight,
        [CommandRequest(name="open", payload={"seats": ["1A"]})],
    )

    try:
        await send_batch(
            stack.client, stack.task_queue, flight, [assign("1A", f"p{n}") for n in range(101)]
        )
    except Exception as err:
        refused = err
    state = await stack.client.get_workflow_handle(f"agg/flight/{flight}").query("state")

    assert "1 to 100 commands, not 101" in str(getattr(refused, "cause", refused))
    assert state["version"] == 1


async def test_many_callers_on_one_aggregate_share_updates_and_none_is_refused(
    stack_factory, dev_env
) -> None:
    """On the dev server's default limits (10 updates in flight): 200 concurrent callers of
    one client each get their own answer; a few updates carry them all."""
    stack = await stack_factory(env=dev_env)
    client = AggregateClient(stack.client, stack.task_queue, definitions=SEED_TYPES.definitions)
    flight = unique_name("BA")
    seats = [f"{row}{letter}" for row in range(1, 35) for letter in "ABCDEF"][:200]
    await client.command("flight", flight, "open", {"seats": seats})

    async def take(n: int) -> Any:
        payload = {"seat": seats[n], "passenger_id": f"p{n}"}
        return await client.command("flight", flight, "assign_seat", payload, command_id=f"c{n}")

    # Callers whose command `decide` refuses, among the others: each gets its own 422.
    async def refused(n: int) -> Exception:
        payload = {"seat": f"Z{n}", "passenger_id": f"x{n}"}
        try:
            await client.command("flight", flight, "assign_seat", payload)
        except Exception as err:
            return err
        raise AssertionError("a command for no seat was accepted")

    results = await asyncio.gather(
        *(take(n) for n in range(len(seats))), *(refused(n) for n in range(40))
    )
    taken, refusals = results[: len(seats)], results[len(seats) :]
    view = await client.state("flight", flight)
    counts = await history_counts(stack.client, f"agg/flight/{flight}")
    for _ in range(100):
        stored = event_store.events(stack.engine, "flight", flight, limit=1000)
        if len(stored) >= view.version:
            break
        await asyncio.sleep(0.05)

    assert all(result.events for result in taken)
    assert all(isinstance(err, InvalidCommand) and "no such seat" in str(err) for err in refusals)
    assert view.state["seats"] == {seat: f"p{n}" for n, seat in enumerate(seats)}
    # Each command saw the state the one before it left: no two answered the same version.
    versions = sorted(result.version for result in taken)
    assert versions == list(range(2, len(seats) + 2))
    assert [event.seq for event in stored] == list(range(1, view.version + 1))
    updates = counts[EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED]
    assert updates < len(seats) // 4, updates


async def test_signalled_commands_from_many_callers_go_as_few_signals(stack_factory) -> None:
    stack = await stack_factory()
    client = AggregateClient(stack.client, stack.task_queue, definitions=SEED_TYPES.definitions)
    flight = unique_name("BA")
    seats = [f"{row}A" for row in range(1, 41)]
    await client.command("flight", flight, "open", {"seats": seats})

    await asyncio.gather(
        *(
            client.send(
                "flight",
                flight,
                "assign_seat",
                {"seat": seat, "passenger_id": f"p{n}"},
                command_id=f"s{n}",
            )
            for n, seat in enumerate(seats)
        ),
        # A repeat, and one `decide` refuses: deduped, and kept in the rejected log.
        client.send(
            "flight", flight, "assign_seat", {"seat": "1A", "passenger_id": "p0"}, command_id="s0"
        ),
        client.send(
            "flight", flight, "assign_seat", {"seat": "99Z", "passenger_id": "x"}, command_id="bad"
        ),
    )
    for _ in range(100):
        view = await client.state("flight", flight)
        rejected = await client.rejected("flight", flight)
        if view.version == len(seats) + 1 and rejected:
            break
        await asyncio.sleep(0.05)
    counts = await history_counts(stack.client, f"agg/flight/{flight}")

    assert view.version == len(seats) + 1
    assert view.state["seats"] == {seat: f"p{n}" for n, seat in enumerate(seats)}
    assert [r.request.command_id for r in rejected] == ["bad"]
    assert counts[EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED] < len(seats) // 4
