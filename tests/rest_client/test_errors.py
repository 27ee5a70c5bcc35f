"""Refusals and outages through the REST client against the real API: the token's 401 and 403,
and a 503 retried as its `Retry-After` says (the waits recorded, not slept)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest
from durable_outbox_rest import (
    AsyncOutboxRest,
    Forbidden,
    NotFound,
    OutboxRest,
    RetryPolicy,
    Unauthorized,
    Unavailable,
)
from durable_outbox_rest.errors import parse_retry_after

from api.main import create_app
from devstack.serving import serve_in_background
from readmodel.db import make_engine
from tests.api.conftest import api_settings, serve_stack
from tests.rest_client.conftest import ServedStack
from worker import default_operations_task_queue

# The API's own Retry-After on a 503 (`api.errors.RETRY_AFTER_S`).
API_RETRY_AFTER_S = 5.0


@contextlib.asynccontextmanager
async def database_down(served: ServedStack) -> AsyncIterator[str]:
    """The app over the same stack, its read-model database unreachable: lists answer 503."""
    unreachable = make_engine("postgresql://nobody@127.0.0.1:1/none?connect_timeout=1")
    settings = api_settings(
        workflow_task_queue=served.stack.task_queue,
        operations_task_queue=default_operations_task_queue(served.stack.task_queue),
    )
    app = create_app(settings, outbox_client=served.stack.outbox, engine=unreachable)
    try:
        async with serve_in_background(app, lifespan="on") as url:
            yield url
    finally:
        unreachable.dispose()


async def test_a_token_is_sent_as_bearer_and_refusals_are_typed(served: ServedStack) -> None:
    async with serve_stack(served.stack, api_token="s3cret") as url:

        def calls() -> tuple[pytest.ExceptionInfo[Unauthorized], int]:
            with pytest.raises(Unauthorized) as anonymous, OutboxRest(url) as rest:
                rest.list_destinations()
            with OutboxRest(url, token="s3cret") as rest:
                return anonymous, len(rest.list_destinations())

        anonymous, destinations = await asyncio.to_thread(calls)
        async with AsyncOutboxRest(url, token="wrong") as rest:
            with pytest.raises(Forbidden) as wrong:
                await rest.get_destination(served.webhook.name)

    assert anonymous.value.status == 401 and anonymous.value.title
    assert wrong.value.status == 403
    assert destinations == 2


async def test_a_503_is_retried_after_its_retry_after_then_raised(served: ServedStack) -> None:
    async with database_down(served) as url:

        def sync_calls() -> tuple[list[float], int, Unavailable]:
            waits: list[float] = []
            sent: list[httpx.Request] = []
            with httpx.Client(event_hooks={"request": [sent.append]}) as http:
                rest = OutboxRest(
                    url, retry=RetryPolicy(attempts=3), http_client=http, sleep=waits.append
                )
                with pytest.raises(Unavailable) as unavailable:
                    rest.list_items("restdown")
            return waits, len(sent), unavailable.value

        waits, requests, error = await asyncio.to_thread(sync_calls)

        async_waits: list[float] = []

        async def record(seconds: float) -> None:
            async_waits.append(seconds)

        patient = AsyncOutboxRest(url, retry=RetryPolicy(attempts=2), sleep=record)
        impatient = AsyncOutboxRest(url, retry=RetryPolicy(max_delay_s=1), sleep=record)
        async with patient, impatient:
            with pytest.raises(Unavailable):
                await patient.list_dead_letters("restdown")
            async_after_patient = list(async_waits)
            with pytest.raises(Unavailable) as refused_at_once:
                await impatient.list_items("restdown")

    assert waits == [API_RETRY_AFTER_S, API_RETRY_AFTER_S] and requests == 3
    assert error.retry_after == API_RETRY_AFTER_S
    assert error.type.endswith("/database-unavailable")
    assert async_after_patient == [API_RETRY_AFTER_S]
    # Asked to wait longer than the policy allows: raised without waiting.
    assert async_waits == async_after_patient
    assert refused_at_once.value.retry_after == API_RETRY_AFTER_S


def test_retry_after_is_read_as_seconds_or_an_http_date() -> None:
    now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    in_a_minute = format_datetime(now + timedelta(minutes=1), usegmt=True)

    assert parse_retry_after("7", now) == 7.0
    assert parse_retry_after(in_a_minute, now) == 60.0
    assert parse_retry_after(format_datetime(now - timedelta(hours=1), usegmt=True), now) == 0.0
    assert parse_retry_after("soon", now) is None
    assert parse_retry_after("٣", now) is None  # a non-ASCII digit is not a delay
    assert parse_retry_after(None, now) is None


async def test_a_refusal_other_than_429_or_503_is_never_retried(served: ServedStack) -> None:
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    async with AsyncOutboxRest(served.url, retry=RetryPolicy(), sleep=record) as rest:
        with pytest.raises(NotFound):
            await rest.get_item("restdown", "never-enqueued")

    assert waits == []
