"""A quota's window: from one second to a day, whatever way it is written."""

from __future__ import annotations

from datetime import timedelta

import pytest
from durable_outbox_temporal.contract.flow_policy import Quota, window
from pydantic import ValidationError


@pytest.mark.parametrize("per", [0, 1e-9, 0.5, "0s", "999ms", "2d", 86_401])
def test_a_window_outside_one_second_to_a_day_is_refused(per: str | float) -> None:
    with pytest.raises(ValidationError, match="at least 1 s and at most 1 day, 0:00:00"):
        Quota(per=per, max=1)


@pytest.mark.parametrize(
    ("per", "expected"),
    [(1, timedelta(seconds=1)), ("1000ms", timedelta(seconds=1)), ("1d", timedelta(days=1))],
)
def test_the_bounds_themselves_are_windows(per: str | float, expected: timedelta) -> None:
    assert window(per) == expected
