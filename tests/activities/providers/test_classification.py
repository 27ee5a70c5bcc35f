"""Which failures are retried and which are final, and how long Retry-After says to wait."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest

from activities.providers import build_provider
from activities.providers.base import (
    PermanentProviderError,
    TransientProviderError,
    parse_retry_after,
    raise_for_status,
)
from activities.providers.webhook import WebhookProvider
from common.destinations import Destination
from common.models import SubmitRequest
from tests.conftest import WEBHOOK_SECRET

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def test_retry_after_seconds() -> None:
    assert parse_retry_after("120") == 120.0


def test_retry_after_http_date_is_never_shorter_than_the_real_wait() -> None:
    value = format_datetime(NOW + timedelta(seconds=30), usegmt=True)
    assert parse_retry_after(value, now=NOW) >= 30.0


def test_retry_after_in_the_past_or_garbage() -> None:
    past = format_datetime(NOW - timedelta(minutes=5), usegmt=True)
    assert parse_retry_after(past, now=NOW) == 0.0
    assert parse_retry_after("soon", now=NOW) is None
    assert parse_retry_after(None) is None


@pytest.mark.parametrize("status", [408, 425, 429, 500, 502, 503, 504])
def test_transient_statuses(status: int) -> None:
    response = httpx.Response(status, headers={"Retry-After": "7"})
    with pytest.raises(TransientProviderError) as error:
        raise_for_status(response, "x")
    assert error.value.retry_after_s == 7.0 and error.value.status_code == status


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 410, 422])
def test_permanent_statuses(status: int) -> None:
    with pytest.raises(PermanentProviderError):
        raise_for_status(httpx.Response(status), "x")


def submit(key: str) -> SubmitRequest:
    return SubmitRequest(destination="d", item_id="i", idempotency_key=key, payload={}, attempt=1)


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


def webhook_at(http: httpx.AsyncClient, url: str, **settings: object) -> WebhookProvider:
    return WebhookProvider({"url": url, "secret": WEBHOOK_SECRET, **settings}, http)


async def test_webhook_410_is_permanent_and_says_endpoint_gone(fake_provider, http) -> None:
    provider = webhook_at(
        http, f"{fake_provider.url}/webhook/gone", headers={"X-Fake-Status": "410"}
    )
    with pytest.raises(PermanentProviderError, match="disabled"):
        await provider.submit(submit("gone-1"))


async def test_webhook_429_carries_retry_after(fake_provider, http) -> None:
    provider = webhook_at(
        http,
        f"{fake_provider.url}/webhook/busy",
        headers={"X-Fake-Status": "429", "X-Fake-Retry-After": "7"},
    )
    with pytest.raises(TransientProviderError) as error:
        await provider.submit(submit("busy-1"))
    assert error.value.retry_after_s == 7.0


async def test_connection_refused_is_transient(http) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    provider = webhook_at(http, f"http://127.0.0.1:{port}/hook")
    with pytest.raises(TransientProviderError, match="connection failed"):
        await provider.submit(submit("refused-1"))


async def test_hung_request_times_out_as_transient(fake_provider, http) -> None:
    provider = webhook_at(
        http, f"{fake_provider.url}/webhook/slow", headers={"X-Fake-Hang-S": "3"}, timeout_s=0.2
    )
    with pytest.raises(TransientProviderError, match="timed out"):
        await provider.submit(submit("slow-1"))


async def test_unknown_provider_and_missing_settings_are_named(http) -> None:
    with pytest.raises(ValueError, match="unknown provider 'sms'"):
        build_provider(Destination(name="x", provider="sms"), http)
    with pytest.raises(ValueError, match="'x'.*need url, secret"):
        build_provider(Destination(name="x", provider="webhook"), http)
