"""Dead letters, ordering lanes, destinations and aggregates through the REST client, against
the real API over HTTP."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from durable_outbox_rest import (
    AsyncOutboxRest,
    Conflict,
    ItemStatus,
    NotFound,
    OutboxRest,
    Unprocessable,
)
from durable_outbox_temporal.contract.ids import item_workflow_id

from tests.fakes import script
from tests.rest_client.conftest import ServedStack
from tests.rest_client.test_items import wait_for_status_async

REFUSED = [{"status": 400}]


async def test_a_dead_letter_is_listed_and_redriven_as_a_batch(served: ServedStack) -> None:
    outbox = f"restdead-{uuid.uuid4().hex[:6]}"
    await script(served.stack.fake, item_workflow_id(outbox, "d-1"), REFUSED)
    async with AsyncOutboxRest(served.url) as rest:
        await rest.enqueue(outbox, served.webhook.name, {"n": 1}, idempotency_key="d-1")
        await rest.enqueue(outbox, served.webhook.name, {"n": 2}, idempotency_key="d-2")
        failed = await wait_for_status_async(rest, outbox, "d-1", ItemStatus.FAILED)
        await wait_for_status_async(rest, outbox, "d-2", ItemStatus.SENT)
        deadline = time.monotonic() + 30
        while not (letters := [x async for x in rest.iter_dead_letters(outbox, page_size=1)]):
            assert time.monotonic() < deadline, "no dead letter listed"
            await asyncio.sleep(0.2)
        batch = await rest.redrive_dead_letters(outbox, destination=served.webhook.name)
        deadline = time.monotonic() + 30
        while not (progress := await rest.redrive_batch(outbox, batch.id)).done:
            assert time.monotonic() < deadline, progress
            await asyncio.sleep(0.2)
        redriven = await wait_for_status_async(rest, outbox, "d-1", ItemStatus.SENT)
        with pytest.raises(NotFound) as unknown_batch:
            await rest.redrive_batch(outbox, uuid.uuid4().hex)

    assert failed.status == ItemStatus.FAILED and failed.last_error
    assert [(letter.key, letter.attempts) for letter in letters] == [("d-1", 1)]
    assert letters[0].failed_at is not None and letters[0].links["redrive"]
    assert batch.outbox == outbox and batch.destination == served.webhook.name
    assert progress.redriven == 1 and progress.errors == []
    assert redriven.status == ItemStatus.SENT
    assert unknown_batch.value.type.endswith("/redrive-batch-not-found")


async def test_a_halted_lane_is_read_and_resumed_by_redriving_its_head(
    served: ServedStack,
) -> None:
    outbox = f"restlane-{uuid.uuid4().hex[:6]}"
    await script(served.stack.fake, item_workflow_id(outbox, "l-0"), REFUSED)
    async with AsyncOutboxRest(served.url) as rest:
        for n in range(2):
            await rest.enqueue(
                outbox, served.webhook.name, {"n": n}, idempotency_key=f"l-{n}", ordering_key="acct"
            )
        deadline = time.monotonic() + 30
        while (lane := await rest.get_lane(outbox, "acct")).status != "halted":
            assert time.monotonic() < deadline, lane
            await asyncio.sleep(0.2)
        halted = await rest.list_lanes(outbox, status="halted")
        with pytest.raises(NotFound) as no_lane:
            await rest.get_lane(outbox, "nobody")
        await rest.redrive(outbox, "l-0")
        ends = [
            await wait_for_status_async(rest, outbox, f"l-{n}", ItemStatus.SENT) for n in range(2)
        ]

    assert lane.head_key == "l-0" and lane.length == 2 and lane.waiting == ["l-1"]
    assert lane.source == "workflow" and lane.halted_reason
    assert [entry.ordering_key for entry in halted.lanes] == ["acct"]
    assert no_lane.value.type.endswith("/lane-not-found")
    assert [item.status for item in ends] == [ItemStatus.SENT, ItemStatus.SENT]


async def test_destinations_are_read_with_their_rates_in_force(served: ServedStack) -> None:
    def calls() -> tuple[list[str], float, pytest.ExceptionInfo[NotFound]]:
        with OutboxRest(served.url) as rest:
            names = sorted(destination.name for destination in rest.list_destinations())
            webhook = rest.get_destination(served.webhook.name)
            with pytest.raises(NotFound) as unknown:
                rest.get_destination("no-such-destination")
        return names, webhook.submit.rate, unknown

    names, submit_rate, unknown = await asyncio.to_thread(calls)

    assert names == sorted([served.email.name, served.webhook.name])
    assert submit_rate == served.webhook.submit_rate
    assert unknown.value.status == 404


async def test_aggregate_commands_and_state(served: ServedStack) -> None:
    flight = f"BA{uuid.uuid4().hex[:6]}"
    async with AsyncOutboxRest(served.url) as rest:
        opened = await rest.command("flight", flight, "open", {"seats": ["1A", "1B"]})
        seated = await rest.command(
            "flight", flight, "assign_seat", {"seat": "1A", "passenger_id": "p1"}, command_id="s-1"
        )
        repeated = await rest.command(
            "flight", flight, "assign_seat", {"seat": "1A", "passenger_id": "p1"}, command_id="s-1"
        )
        with pytest.raises(Conflict) as taken:
            await rest.command(
                "flight", flight, "assign_seat", {"seat": "1A", "passenger_id": "p2"}
            )
        with pytest.raises(Conflict) as moved_on:
            await rest.command(
                "flight",
                flight,
                "assign_seat",
                {"seat": "1B", "passenger_id": "p2"},
                expected_version=1,
            )
        with pytest.raises(Unprocessable) as invalid:
            await rest.command("flight", flight, "assign_seat", {"seat": "1B"})
        with pytest.raises(NotFound) as unknown:
            await rest.command("flight", flight, "board_everyone", {})
        state = await rest.get_aggregate("flight", flight)

    assert opened.version == 1 and [event.type for event in opened.events] == ["FlightOpened"]
    assert seated.version == 2 and not seated.duplicate
    assert seated.events[0].command_id == "s-1"
    assert repeated.duplicate and repeated.version == 2
    assert taken.value.type.endswith("/command-conflict")
    assert moved_on.value.status == 409
    assert invalid.value.errors
    assert unknown.value.type.endswith("/unknown-command")
    assert state.version == 2 and state.state["seats"] == {"1A": "p1", "1B": None}
