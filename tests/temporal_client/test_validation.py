"""The client's argument checks: the due-time rule of `durable_outbox_temporal.contract.limits`."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from durable_outbox_temporal.contract.limits import MAX_START_DELAY
from durable_outbox_temporal.errors import InvalidRequest
from durable_outbox_temporal.validation import (
    MAX_JSON_DEPTH,
    validate_json_depth,
    validate_new_item,
    validate_not_before,
    validate_utc_date,
)

NOW = datetime(2026, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)


@pytest.mark.parametrize(
    "not_before",
    [
        NOW - timedelta(days=1),  # already due: delivered at once
        NOW,
        NOW + timedelta(hours=1),
        NOW + MAX_START_DELAY,  # exactly the longest delay Temporal honours
        # The same instant in another time zone.
        (NOW + MAX_START_DELAY).astimezone(timezone(timedelta(hours=-8))),
    ],
)
def test_a_due_time_the_engine_can_honour_is_accepted(not_before: datetime) -> None:
    assert validate_not_before(not_before, NOW) == not_before


@pytest.mark.parametrize(
    "not_before",
    [
        NOW + MAX_START_DELAY + timedelta(seconds=1),
        NOW + MAX_START_DELAY + timedelta(days=366),  # where 100 calendar years would end
        datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC),
    ],
)
def test_a_due_time_beyond_the_limit_is_refused_with_the_limit(not_before: datetime) -> None:
    with pytest.raises(InvalidRequest) as refused:
        validate_not_before(not_before, NOW)

    message = str(refused.value)
    assert f"{MAX_START_DELAY.days} days" in message
    assert (NOW + MAX_START_DELAY).isoformat(timespec="seconds") in message


async def test_the_limit_is_where_the_server_cuts_a_start_delay(dev_env) -> None:
    """The real server keeps a start delay up to the limit and silently cuts a longer one to
    it, so the check must refuse exactly what lies beyond. (The time-skipping test server
    cuts nothing, hence the dev server.)"""
    kept: dict[timedelta, timedelta] = {}
    for asked in (MAX_START_DELAY, MAX_START_DELAY + timedelta(seconds=1)):
        handle = await dev_env.client.start_workflow(
            "StartDelayProbe",
            id=f"start-delay-{uuid.uuid4()}",
            task_queue=f"nobody-{uuid.uuid4()}",
            start_delay=asked,
        )
        description = await handle.describe()
        await handle.terminate(reason="probe")
        assert description.execution_time is not None and description.start_time is not None
        kept[asked] = description.execution_time - description.start_time

    assert kept == {
        MAX_START_DELAY: MAX_START_DELAY,
        MAX_START_DELAY + timedelta(seconds=1): MAX_START_DELAY,
    }


def test_a_naive_due_time_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="time-zone aware"):
        validate_not_before(datetime(2026, 5, 2, 12, 0), NOW)


@pytest.mark.parametrize(
    "not_before",
    [
        datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14))),  # year 0 in UTC
        datetime(9999, 12, 31, 23, 59, tzinfo=timezone(timedelta(hours=-14))),  # year 10000
    ],
)
def test_a_due_time_outside_years_1_to_9999_in_utc_is_refused(not_before: datetime) -> None:
    """Issue 31: such a date passed the checks and broke the read model's projection."""
    with pytest.raises(InvalidRequest, match="years 1 to 9999"):
        validate_not_before(not_before, NOW)


def test_a_date_is_read_in_utc_and_a_naive_one_is_utc() -> None:
    paris = datetime(2026, 5, 1, 14, tzinfo=timezone(timedelta(hours=2)))

    assert validate_utc_date(paris, "failed_from") == datetime(2026, 5, 1, 12, tzinfo=UTC)
    assert validate_utc_date(datetime(2026, 5, 1), "x") == datetime(2026, 5, 1, tzinfo=UTC)


def nested(depth: int, container: str) -> object:
    document: object = "leaf"
    for _ in range(depth):
        document = {"a": document} if container == "object" else [document]
    return document


@pytest.mark.parametrize("container", ["object", "array"])
def test_a_document_may_nest_up_to_the_limit(container: str) -> None:
    validate_json_depth(nested(MAX_JSON_DEPTH, container))


@pytest.mark.parametrize("container", ["object", "array"])
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 900, 100_000])
def test_a_document_nested_past_the_limit_is_refused_without_recursing(
    container: str, depth: int
) -> None:
    """Issue 31: payloads nested 500-900 deep broke with `RecursionError` further on."""
    with pytest.raises(InvalidRequest, match=f"more than {MAX_JSON_DEPTH} levels"):
        validate_json_depth(nested(depth, container), "payload")


def test_a_new_item_with_a_payload_nested_too_deeply_is_refused() -> None:
    """For callers that reach the client without the API's body check (the relay, the CLI)."""
    with pytest.raises(InvalidRequest, match="payload nests"):
        validate_new_item(
            "tests",
            "key",
            ordering_key=None,
            not_before=None,
            max_attempts=None,
            now=NOW,
            payload=nested(900, "object"),
        )
