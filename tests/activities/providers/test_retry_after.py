"""`parse_retry_after` and the status-code table that decides retry versus give up."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest

from activities.providers.base import (
    PermanentProviderError,
    TransientProviderError,
    parse_retry_after,
    raise_for_status,
)

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(("value", "seconds"), [("0", 0.0), ("7", 7.0), (" 120 ", 120.0)])
def test_delta_seconds(value: str, seconds: float) -> None:
    assert parse_retry_after(value, now=NOW) == seconds


@pytest.mark.parametrize("now_offset_s", [0.0, 0.2, 0.999])
def test_future_http_date_is_never_less_than_the_real_remaining_time(now_offset_s: float) -> None:
    # The sender meant 30.7 s from NOW, but an HTTP-date truncates to whole seconds.
    intended = NOW + timedelta(seconds=30.7)
    now = NOW + timedelta(seconds=now_offset_s)

    waited = parse_retry_after(format_datetime(intended, usegmt=True), now=now)

    assert waited is not None
    assert waited >= (intended - now).total_seconds()
    assert waited <= (intended - now).total_seconds() + 1.0


def test_future_http_date_against_the_real_clock() -> None:
    when = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=10)

    waited = parse_retry_after(format_datetime(when, usegmt=True))

    assert waited is not None and 9.0 <= waited <= 11.0


def test_past_http_date_is_zero() -> None:
    past = format_datetime(NOW - timedelta(minutes=5), usegmt=True)

    assert parse_retry_after(past, now=NOW) == 0.0


@pytest.mark.parametrize("value", [None, "", "   ", "soon", "-5", "1.5", "Mon, 99 Foo"])
def test_garbage_is_none(value: str | None) -> None:
    assert parse_retry_after(value, now=NOW) is None


@pytest.mark.parametrize("status", [408, 425, 429, 500, 502, 503, 504])
def test_transient_statuses(status: int) -> None:
    response = httpx.Response(status, headers={"Retry-After": "7"}, text="busy")

    with pytest.raises(TransientProviderError) as error:
        raise_for_status(response, "send")

    assert (error.value.status_code, error.value.retry_after_s) == (status, 7.0)
    assert f"send: HTTP {status}: busy" in str(error.value)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422])
def test_permanent_statuses(status: int) -> None:
    response = httpx.Response(status, text="nope")

    with pytest.raises(PermanentProviderError) as error:
        raise_for_status(response, "send")

    assert error.value.status_code == status
    assert not isinstance(error.value, TransientProviderError)
    assert f"HTTP {status}: nope" in str(error.value)


@pytest.mark.parametrize("status", [200, 202, 204])
def test_success_raises_nothing(status: int) -> None:
    raise_for_status(httpx.Response(status), "send")
