"""A quota's window: from a millisecond to a day, whatever way it is written."""

from __future__ import annotations

from datetime import timedelta

import pytest
from durable_outbox_temporal.contract.flow_policy import Quota, window
from pydantic import ValidationError


@pytest.mark.parametrize("per", [0, 1e-9, 0.0005, "0s", "0.5ms", "2d", 86_401])
def test_a_window_outside_a_millisecond_to_a_day_is_refused(per: str | float) -> None:
    with pytest.raises(ValidationError, match="at least 0.001 s and at most 1 day, 0:00:00"):
        Quota(per=per, max=1)


@pytest.mark.parametrize(
    ("per", "expected"),
    [
        (0.001, timedelta(milliseconds=1)),
        ("1ms", timedelta(milliseconds=1)),
        ("1d", timedelta(days=1)),
    ],
)
def test_the_bounds_themselves_are_windows(per: str | float, expected: timedelta) -> None:
    assert window(per) == expected
