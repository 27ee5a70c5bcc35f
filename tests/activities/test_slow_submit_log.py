"""A submit that reaches its worker long after the server started it, or that waits long in
the worker before its request goes, says so in the log, naming which: a full bench run saw a few
items a round end a minute after the rest, with nothing in any log to tell where the minute
went (issue 43)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from durable_outbox_temporal.contract.item import SubmitRequest
from temporalio.testing import ActivityEnvironment

from activities import delivery
from activities.delivery import DeliveryActivities
from activities.delivery_projection import LeftToWorkflow
from activities.providers import build_provider
from tests.conftest import unique_name, webhook_destination
from tests.workflows.test_activity_projection import no_flow_rules


async def submit(fake_provider, environment: ActivityEnvironment, held_s: float) -> None:
    destination = webhook_destination(fake_provider)
    guard = no_flow_rules()

    @contextlib.asynccontextmanager
    async def slow(request: SubmitRequest) -> AsyncIterator[None]:
        await asyncio.sleep(held_s)  # as a pacer, a throttle's pause or a cap would hold it
        yield

    async with httpx.AsyncClient() as http:
        activities = DeliveryActivities(
            {destination.name: build_provider(destination, http)}, guard, LeftToWorkflow()
        )
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(guard, "submit", slow)
            await environment.run(
                activities.submit_item,
                SubmitRequest(
                    destination=destination.name,
                    item_id="tests/slow",
                    idempotency_key=unique_name("idem"),
                    payload={"event": "order.paid"},
                    attempt=1,
                ),
            )


async def test_a_submit_held_in_the_worker_says_so(fake_provider, caplog, monkeypatch) -> None:
    # The threshold is the late-arrival one too: 2 s, so a loaded machine's set-up between
    # `started_time` and the activity's start stays below it (0.2 s did not, once, in CI).
    monkeypatch.setattr(delivery, "SLOW_START_S", 2.0)
    environment = ActivityEnvironment()
    environment.info = dataclasses.replace(environment.info, started_time=datetime.now(UTC))

    with caplog.at_level(logging.WARNING):
        await submit(fake_provider, environment, held_s=2.5)

    messages = [record.getMessage() for record in caplog.records]
    assert any("submit of tests/slow held " in message for message in messages), messages
    assert not any("reached this worker" in message for message in messages), messages


async def test_a_submit_that_reached_its_worker_late_says_so(fake_provider, caplog) -> None:
    environment = ActivityEnvironment()
    started = datetime.now(UTC) - timedelta(seconds=60)
    environment.info = dataclasses.replace(environment.info, started_time=started)

    with caplog.at_level(logging.WARNING):
        await submit(fake_provider, environment, held_s=0)

    messages = [record.getMessage() for record in caplog.records]
    assert any("reached this worker 60." in message for message in messages), messages
    assert not any("held" in message for message in messages), messages
