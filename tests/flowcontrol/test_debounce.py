"""The debounce rule: what an enqueue may ask for, when a window closes, what its carrier sends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from durable_outbox_temporal.contract.debounce import COLLECTED_KEY
from durable_outbox_temporal.contract.debounce_rules import (
    MAX_MEMBERS,
    carried_payload,
    check_payload,
    closes_at,
    debounce_spec,
    delivered_body,
)
from durable_outbox_temporal.contract.item import DebounceSpec

T0 = datetime(2026, 11, 27, tzinfo=UTC)


def _spec(**fields: Any) -> DebounceSpec | None:
    arguments: dict[str, Any] = {
        "debounce_key": "k",
        "debounce_s": 10.0,
        "mode": None,
        "max_wait_s": None,
        "provider": "webhook",
        "ordering_key": None,
        "not_before": None,
    }
    arguments.update(fields)
    key, seconds = arguments.pop("debounce_key"), arguments.pop("debounce_s")
    return debounce_spec(key, seconds, **arguments)


def test_defaults_latest_and_a_cap_of_ten_windows() -> None:
    assert _spec() == DebounceSpec(key="k", window_s=10.0, max_wait_s=100.0, mode="latest")
    assert _spec(debounce_key=None, debounce_s=None) is None


@pytest.mark.parametrize(
    "fields",
    [
        {"debounce_key": None},  # debounce_s alone
        {"debounce_key": None, "debounce_s": None, "max_wait_s": 5.0},
        {"debounce_s": None},
        {"debounce_s": 0.0},
        {"debounce_s": 86400.5},
        {"ordering_key": "o"},
        {"not_before": T0},
        {"mode": "collect", "provider": "acs-email"},
        {"mode": "first"},
        {"max_wait_s": 9.0},
        {"max_wait_s": 8 * 86400.0},
        {"debounce_key": "a/b"},
    ],
)
def test_unsupported_combinations_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        _spec(**fields)


def test_a_window_closes_after_its_last_item_but_never_past_its_cap() -> None:
    spec = DebounceSpec(key="k", window_s=10, max_wait_s=15)
    assert closes_at([(T0, spec)]) == T0 + timedelta(seconds=10)
    later = [(T0, spec), (T0 + timedelta(seconds=4), spec)]
    assert closes_at(later) == T0 + timedelta(seconds=14)
    capped = [(T0, spec), (T0 + timedelta(seconds=8), spec)]
    assert closes_at(capped) == T0 + timedelta(seconds=15)
    # Every member's own cap holds, a tighter later one too.
    tight = DebounceSpec(key="k", window_s=10, max_wait_s=11)
    assert closes_at([(T0, spec), (T0 + timedelta(seconds=2), tight)]) == T0 + timedelta(seconds=11)


def test_a_full_window_closes_when_its_last_place_is_taken() -> None:
    spec = DebounceSpec(key="k", window_s=10, max_wait_s=100)
    joined = [(T0 + timedelta(milliseconds=n), spec) for n in range(MAX_MEMBERS + 5)]
    assert closes_at(joined) == T0 + timedelta(milliseconds=MAX_MEMBERS - 1)


def test_the_carrier_sends_the_last_payload_or_every_payload_as_an_array() -> None:
    payloads = [{"n": 1}, {"n": 2}]
    assert carried_payload("latest", payloads) == {"n": 2}
    collected = carried_payload("collect", payloads)
    assert delivered_body(collected) == [{"n": 1}, {"n": 2}]
    assert delivered_body({"n": 2}) == {"n": 2}
    with pytest.raises(ValueError):
        check_payload({COLLECTED_KEY: []})
