"""The process manager on the time-skipping server: policies plan effects into the ledger, the
executor runs them once per key (enqueue, command, provider call), failed ones are retried by
an operator, and a replay of the history plans and runs nothing twice."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from durable_outbox_temporal.aggregate_definition import CallProvider, Effect, IssueCommand
from durable_outbox_temporal.aggregates import AggregateClient
from durable_outbox_temporal.contract.aggregate import (
    EffectExecution,
    EffectRecord,
    aggregate_workflow_id,
)
from durable_outbox_temporal.contract.ids import item_workflow_id, provider_idempotency_key
from durable_outbox_temporal.errors import CommandConflict, EffectNotFailed, UnknownEffect
from temporalio.worker import Replayer

from activities.effects import EffectActivities
from examples.flight.domainmodel import FlightSeating
from examples.labour.domainmodel import EMAIL_DESTINATION, NOTIFICATIONS_OUTBOX, WEBHOOK_DESTINATION
from tests.conftest import email_destination, unique_name, webhook_destination
from tests.workflows.test_outbox_item import timer_durations
from worker import WORKFLOWS, default_operations_task_queue
from workflows.aggregate_types import HOSTED

T = TypeVar("T")
SEATS = {"seats": ["1A", "1B"]}


def aggregates_on(stack: Any) -> AggregateClient:
    # Every type this process's workers host: the seed ones and any a test adds.
    return AggregateClient(
        stack.client,
        stack.task_queue,
        definitions=dict(HOSTED),
        operations_task_queue=default_operations_task_queue(stack.task_queue),
    )


async def eventually(probe: Callable[[], Awaitable[T | None]], timeout_s: float = 30) -> T:
    """The probe's first truthy answer, polling; fails the test after `timeout_s`."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        answer = await probe()
        if answer:
            return answer
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.05)


def settled(
    client: AggregateClient, aggregate_type: str, aggregate_id: str, count: int
) -> Callable[[], Awaitable[list[EffectRecord] | None]]:
    """A probe: the ledger once it holds `count` effects and none is pending."""

    async def probe() -> list[EffectRecord] | None:
        effects = await client.effects(aggregate_type, aggregate_id)
        if len(effects) == count and all(e.status != "pending" for e in effects):
            return effects
        return None

    return probe


async def test_labour_policies_run_once_each_through_the_outbox(
    stack_factory, fake_provider
) -> None:
    stack = await stack_factory(
        email_destination(fake_provider, name=EMAIL_DESTINATION),
        webhook_destination(fake_provider, name=WEBHOOK_DESTINATION),
    )
    client = aggregates_on(stack)
    labour = unique_name("labour")

    async def run(command: str, **payload: Any) -> None:
        await client.command("labour", labour, command, payload)

    await run("plan_labour", actor="m1", mother_name="Ada", contact={"email": "ada@example.com"})
    # The token policy issued set_subscription_token back to the aggregate, once.
    [token_effect] = await eventually(settled(client, "labour", labour, 1))
    token = (await client.state("labour", labour)).state["subscription_token"]
    assert token and token_effect.status == "done" and token_effect.kind == "issue_command"
    assert token_effect.key == f"labour:{labour}:1:subscription-token"
    assert token_effect.result == {"target": f"labour/{labour}", "version": 2, "duplicate": False}

    with pytest.raises(CommandConflict, match="WrongToken"):
        await run(
            "request_access", actor="s1", token="guess", name="Bo", contact={"email": "b@x.io"}
        )
    await run("request_access", actor="s1", token=token, name="Bo", contact={"email": "bo@x.io"})
    both = {"email": "cy@x.io", "webhook": "https://cy.example/hook"}
    await run("request_access", actor="s2", token=token, name="Cy", contact=both)
    await run("request_access", actor="s3", token=token, name="Di", contact={"email": "di@x.io"})
    await run("approve_subscriber", actor="m1", subscriber="s1", role="birth_partner")
    await run("approve_subscriber", actor="m1", subscriber="s2", role="observer")
    with pytest.raises(CommandConflict, match="NotAllowed"):
        await run("start_contraction", actor="s2")  # an observer only reads
    with pytest.raises(CommandConflict, match="NotAllowed"):
        await run("approve_subscriber", actor="s1", subscriber="s3", role="observer")
    await run("start_contraction", actor="s1")
    with pytest.raises(CommandConflict, match="under way"):
        await run("start_contraction", actor="m1")
    await run("end_contraction", actor="s1")
    await run("post_update", actor="s1", message="all well", kind="status")
    await run("post_update", actor="s1", message="It's a girl!", kind="announcement")

    # One item per approved subscriber and contact: s3 was never approved.
    effects = await eventually(settled(client, "labour", labour, 4))
    notifications = {e.name: e for e in effects if e.kind == "enqueue_item"}
    assert sorted(notifications) == ["notify.s1.email", "notify.s2.email", "notify.s2.webhook"]
    for effect in notifications.values():
        assert effect.status == "done" and effect.result is not None, effect
        item_id = item_workflow_id(NOTIFICATIONS_OUTBOX, effect.key)
        assert effect.result == {"item_id": item_id, "created": True}
        assert (await stack.result(item_id)).status == "sent"
        stats = await fake_provider.admin.key_stats(provider_idempotency_key(item_id))
        assert stats["deliveries"] == 1, stats
    view = await client.state("labour", labour)
    assert view.effects == {"pending": 0, "done": 4, "failed": 0}
    assert view.views == {"contractions": 1}

    # A replay re-plans every effect from the same events: same ledger, no new command.
    workflow_id = aggregate_workflow_id("labour", labour)
    history = await stack.client.get_workflow_handle(workflow_id).fetch_history()
    await Replayer(workflows=WORKFLOWS).replay_workflow(history)
    await stack.record_history(workflow_id)


class MirroredFlight(FlightSeating):
    """The flight example with one policy: a seat assigned here is assigned on the passenger's
    mirror flight too (a command to another aggregate)."""

    type_name = "mirrored-flight"
    policies = {
        "SeatAssigned": lambda event, state: [
            Effect(
                "mirror",
                IssueCommand(
                    "assign_seat",
                    {"seat": event.seat, "passenger_id": event.passenger_id},
                    target_type="flight",
                    target_id=f"mirror-{event.passenger_id}",
                ),
            )
        ]
    }


async def test_a_refused_cross_aggregate_command_fails_and_an_operator_retries_it(
    stack_factory, monkeypatch
) -> None:
    monkeypatch.setitem(HOSTED, MirroredFlight.type_name, MirroredFlight())
    stack = await stack_factory()
    client = aggregates_on(stack)
    source, passenger = unique_name("BA"), unique_name("p")
    mirror = f"mirror-{passenger}"
    await client.command("flight", mirror, "open", SEATS)
    await client.command("flight", mirror, "assign_seat", {"seat": "1A", "passenger_id": "other"})
    await client.command(MirroredFlight.type_name, source, "open", SEATS)

    await client.command(
        MirroredFlight.type_name, source, "assign_seat", {"seat": "1A", "passenger_id": passenger}
    )
    [failed] = await eventually(settled(client, MirroredFlight.type_name, source, 1))
    assert failed.status == "failed" and "SeatTaken" in (failed.error or ""), failed
    assert failed.executions == 1

    await client.command("flight", mirror, "release_seat", {"seat": "1A"})
    retried = await client.retry_effect(MirroredFlight.type_name, source, failed.key)
    assert retried.status == "pending" and retried.error is None
    [done] = await eventually(settled(client, MirroredFlight.type_name, source, 1))
    assert done.status == "done" and done.executions == 2, done
    target = await client.state("flight", mirror)
    assert target.state["seats"]["1A"] == passenger and target.version == 4
    with pytest.raises(EffectNotFailed):
        await client.retry_effect(MirroredFlight.type_name, source, done.key)

    # The same effect executed once more (a retried activity) changes nothing.
    executor = EffectActivities(stack.outbox, client)
    again = await executor.execute_effect(
        EffectExecution(MirroredFlight.type_name, source, done.key, done.kind, done.action)
    )
    assert again == {"target": f"flight/{mirror}", "version": 4, "duplicate": True}
    assert (await client.state("flight", mirror)).version == 4
    with pytest.raises(UnknownEffect):
        await client.retry_effect(MirroredFlight.type_name, source, "no-such-effect")


class PingingFlight(FlightSeating):
    """The flight example with a provider call per assigned seat."""

    type_name = "pinging-flight"
    destination = ""
    policies = {
        "SeatAssigned": lambda event, state: [
            Effect(
                "ping",
                CallProvider(PingingFlight.destination, {"seat": event.seat}),
            )
        ]
    }


async def pinging_flight(
    stack_factory: Any, fake_provider: Any, monkeypatch: Any, interceptors: Any = ()
) -> tuple[Any, AggregateClient, str]:
    """A stack hosting `PingingFlight` against a webhook destination, and a new flight's id
    (not opened yet)."""
    webhook = webhook_destination(fake_provider)
    monkeypatch.setattr(PingingFlight, "destination", webhook.name)
    monkeypatch.setitem(HOSTED, PingingFlight.type_name, PingingFlight())
    stack = await stack_factory(webhook, interceptors=list(interceptors))
    return stack, aggregates_on(stack), unique_name("BA")


async def test_a_provider_call_effect_honours_retry_after_and_delivers_once(
    stack_factory, fake_provider, monkeypatch
) -> None:
    stack, client, flight = await pinging_flight(stack_factory, fake_provider, monkeypatch)
    key = f"{PingingFlight.type_name}:{flight}:2:ping"
    provider_key = provider_idempotency_key(f"effect/{key}")
    await fake_provider.admin.script(provider_key, [{"status": 503, "retry_after": "3"}])
    await client.command(PingingFlight.type_name, flight, "open", SEATS)

    await client.command(
        PingingFlight.type_name, flight, "assign_seat", {"seat": "1B", "passenger_id": "p"}
    )
    [effect] = await eventually(settled(client, PingingFlight.type_name, flight, 1))

    assert effect.key == key and effect.status == "done", effect
    assert effect.result is not None and effect.result["delivered"] is True
    stats = await fake_provider.admin.key_stats(provider_key)
    assert (stats["submits"], stats["deliveries"]) == (2, 1), stats
    # The second call waited out the provider's Retry-After, on a durable timer. (Time skipping
    # stays locked: an idle aggregate would skip to the test server's run timeout.)
    assert stats["early_requests"] == 0, stats
    workflow_id = aggregate_workflow_id(PingingFlight.type_name, flight)
    # (The run's other timer is its idle check, an hour after its last command.)
    durations = await timer_durations(stack, workflow_id)
    assert [d for d in durations if d < 3000] == [3.0], durations


async def test_the_ledger_survives_continue_as_new(stack_factory, dev_env, monkeypatch) -> None:
    """The dev server here suggests continue-as-new after 40 history events: 30 effects (half
    refused: their mirror flights are not open) outlive several runs, and a failed one carried
    across is retried in a later run."""
    monkeypatch.setitem(HOSTED, MirroredFlight.type_name, MirroredFlight())
    stack = await stack_factory(env=dev_env)
    client = aggregates_on(stack)
    source = unique_name("BA")
    seats = [f"{row}{letter}" for row in range(1, 6) for letter in "ABCDEF"]
    passengers = [unique_name(f"p{n}") for n in range(len(seats))]
    for passenger in passengers[::2]:
        await client.command("flight", f"mirror-{passenger}", "open", {"seats": seats})
    await client.command(MirroredFlight.type_name, source, "open", {"seats": seats})

    for seat, passenger in zip(seats, passengers, strict=True):
        payload = {"seat": seat, "passenger_id": passenger}
        await client.command(MirroredFlight.type_name, source, "assign_seat", payload)
    effects = await eventually(settled(client, MirroredFlight.type_name, source, len(seats)), 90)

    assert [e.status for e in effects] == ["done", "failed"] * (len(seats) // 2)
    assert all("FlightNotOpen" in (e.error or "") for e in effects[1::2])
    workflow_id = aggregate_workflow_id(MirroredFlight.type_name, source)
    runs = [run async for run in stack.client.list_workflows(f"WorkflowId = '{workflow_id}'")]
    assert len(runs) >= 2, "the aggregate never continued as new"

    # Padding commands (no effects) push the aggregate into yet another run before the retry.
    for _ in range(3):
        await client.command(MirroredFlight.type_name, source, "release_seat", {"seat": seats[0]})
        await client.command(
            MirroredFlight.type_name,
            source,
            "assign_seat",
            {"seat": seats[0], "passenger_id": passengers[0]},
        )

    async def another_run() -> bool:
        # Visibility is eventually consistent: the new run may be listed a moment later
        # (a CI run once listed the same count right after the commands).
        query = f"WorkflowId = '{workflow_id}'"
        return len([run async for run in stack.client.list_workflows(query)]) > len(runs)

    await eventually(another_run)
    failed = effects[1]
    await client.command("flight", f"mirror-{passengers[1]}", "open", {"seats": seats})
    await client.retry_effect(MirroredFlight.type_name, source, failed.key)

    async def retried() -> EffectRecord | None:
        ledger = await client.effects(MirroredFlight.type_name, source)
        record = next(e for e in ledger if e.key == failed.key)
        return record if record.status == "done" else None

    assert (await eventually(retried)).executions == 2
    mirror = await client.state("flight", f"mirror-{passengers[1]}")
    assert mirror.state["seats"][seats[1]] == passengers[1]
