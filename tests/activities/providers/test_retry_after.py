"""`parse_retry_after` and the status-code table that decides retry versus give up."""

from __future__ import annotations

import math
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


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("300000000000", 300000000000.0), ("999999999", 999999999.0), ("9" * 400, math.inf)],
)
def test_huge_delta_seconds_are_kept_not_overflowed(value: str, seconds: float) -> None:
    assert parse_retry_after(value, now=NOW) == seconds


@pytest.mark.parametrize("value", ["²", "٣", "1e9", "+5", "Fri, 31 Dec 99999 23:59:59 GMT"])
def test_digits_float_refuses_and_dates_beyond_the_calendar_are_none(value: str) -> None:
    assert parse_retry_after(value, now=NOW) is None


def test_http_date_at_the_end_of_the_calendar_is_its_distance() -> None:
    waited = parse_retry_after("Fri, 31 Dec 9999 23:59:59 -2359", now=NOW)

    assert waited is not None and waited > 250e9


@pytest.mark.parametrize(
    "value", ["3601", "300000000000", "9" * 400, "Fri, 31 Dec 9999 23:59:59 GMT"]
)
def test_retry_after_beyond_the_maximum_is_permanent_and_says_so(value: str) -> None:
    response = httpx.Response(429, headers={"Retry-After": value}, text="slow down")

    with pytest.raises(PermanentProviderError) as error:
        raise_for_status(response, "send", max_retry_after_s=3600)

    assert not isinstance(error.value, TransientProviderError)
    assert error.value.status_code == 429
    assert "provider asked to retry after" in str(error.value)
    assert "beyond max_retry_after_s (3600 s)" in str(error.value)


def test_retry_after_at_the_maximum_is_waited_exactly() -> None:
    response = httpx.Response(503, headers={"Retry-After": "3600"})

    with pytest.raises(TransientProviderError) as error:
        raise_for_status(response, "send", max_retry_after_s=3600)

    assert error.value.retry_after_s == 3600.0
