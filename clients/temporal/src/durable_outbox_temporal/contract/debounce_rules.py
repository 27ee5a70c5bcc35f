"""Rule: debounce. Items of one debounce key at one destination that arrive within a window
become one delivery: the last one (`latest`), or one carrying every payload as a JSON array
(`collect`); the others end `superseded` by it.

Pure: the bounds and the combinations an enqueue may ask for, when a window closes, and what
its carrier delivers. The window itself is a workflow per key (`workflows/debounce.py`), so it
holds exactly across every API and worker process. Why: docs/decisions/debounce.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Literal, cast, get_args

from durable_outbox_temporal.contract.debounce import COLLECTED_KEY
from durable_outbox_temporal.contract.item import DebounceSpec
from durable_outbox_temporal.contract.limits import check_ordering_key

Mode = Literal["latest", "collect"]
MODES: tuple[str, ...] = get_args(Mode)
# A window's quiet time: up to a day (a longer one is a schedule, not a debounce).
MAX_DEBOUNCE_S = 24 * 3600.0
# The cap from a window's first item: up to a week.
MAX_WAIT_LIMIT_S = 7 * 24 * 3600.0
# Without `max_wait_s`, a window that keeps being extended closes this many windows after its
# first item.
DEFAULT_MAX_WAIT_WINDOWS = 10
# Items one window carries at most: it closes early at that many, so its workflow stays far
# below Temporal's history limits and its carrier's payload (collect) stays deliverable. Later
# items open the next window.
MAX_MEMBERS = 1000
# Only these providers take a JSON array as a payload (an email body is an object).
COLLECT_PROVIDERS = ("webhook",)


def debounce_spec(
    debounce_key: str | None,
    debounce_s: float | None,
    *,
    mode: str | None,
    max_wait_s: float | None,
    provider: str,
    ordering_key: str | None,
    not_before: datetime | None,
) -> DebounceSpec | None:
    """The item's debounce, or None without one; ValueError for a combination that is not
    supported (nothing asked for is ever silently ignored)."""
    if debounce_key is None:
        if debounce_s is not None or mode is not None or max_wait_s is not None:
            raise ValueError("debounce_s, debounce_mode and max_wait_s need a debounce_key")
        return None
    check_debounce_key(debounce_key)
    if debounce_s is None:
        raise ValueError("debounce_key needs debounce_s, the window in seconds")
    if not 0 < debounce_s <= MAX_DEBOUNCE_S:
        raise ValueError(f"debounce_s must be above 0 and at most {MAX_DEBOUNCE_S:g} (a day)")
    if ordering_key is not None:
        raise ValueError(
            "debounce_key cannot be combined with ordering_key: a lane delivers every item"
        )
    if not_before is not None:
        raise ValueError(
            "debounce_key cannot be combined with not_before or delay_seconds: the window"
            " decides when its item goes"
        )
    chosen = mode or "latest"
    if chosen not in MODES:
        raise ValueError(f"debounce_mode must be one of {', '.join(MODES)}")
    if chosen == "collect" and provider not in COLLECT_PROVIDERS:
        raise ValueError(
            f"debounce_mode collect needs a {' or '.join(COLLECT_PROVIDERS)} destination: it"
            f" delivers a JSON array, which a {provider} destination does not take"
        )
    if max_wait_s is None:
        max_wait_s = min(debounce_s * DEFAULT_MAX_WAIT_WINDOWS, MAX_WAIT_LIMIT_S)
    elif not debounce_s <= max_wait_s <= MAX_WAIT_LIMIT_S:
        raise ValueError(
            f"max_wait_s must be at least debounce_s and at most {MAX_WAIT_LIMIT_S:g} (a week)"
        )
    return DebounceSpec(
        key=debounce_key, window_s=debounce_s, max_wait_s=max_wait_s, mode=cast(Mode, chosen)
    )


def check_debounce_key(debounce_key: str) -> str:
    """`debounce_key` if it is a valid debounce key (the rules of an ordering key: it is one
    segment of its window's workflow id); raises ValueError otherwise."""
    try:
        return check_ordering_key(debounce_key)
    except ValueError as err:
        raise ValueError(str(err).replace("ordering key", "debounce key")) from None


def check_payload(payload: dict[str, Any]) -> None:
    """Refuse a payload that would read as a collected one (`COLLECTED_KEY` is reserved)."""
    if COLLECTED_KEY in payload:
        raise ValueError(f"payload member {COLLECTED_KEY!r} is reserved for debounce collect")


def closes_at(joined: Sequence[tuple[datetime, DebounceSpec]]) -> datetime:
    """When a window of these members (join time and spec, in join order) closes: its last
    member's quiet time after it joined, but never past any member's cap from the first join;
    at once when it holds `MAX_MEMBERS`."""
    first_at = joined[0][0]
    if len(joined) >= MAX_MEMBERS:
        return joined[MAX_MEMBERS - 1][0]
    last_at, last = joined[-1]
    quiet = last_at + timedelta(seconds=last.window_s)
    cap = min(first_at + timedelta(seconds=spec.max_wait_s) for _, spec in joined)
    return min(quiet, cap)


def carried_payload(mode: str, payloads: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What the window's carrier delivers: the last payload (`latest`), or every payload in
    join order under `COLLECTED_KEY`, which the webhook provider posts as the JSON array."""
    if mode == "collect":
        return {COLLECTED_KEY: list(payloads)}
    return payloads[-1]


def delivered_body(payload: dict[str, Any]) -> Any:
    """The JSON a provider posts for an item's payload: the array of a collected one."""
    if len(payload) == 1 and COLLECTED_KEY in payload:
        return payload[COLLECTED_KEY]
    return payload
