"""The client's argument checks: the due-time rule of `contract.limits`."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from contract.limits import MAX_START_DELAY
from outbox_client.errors import InvalidRequest
from outbox_client.validation import validate_not_before

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
