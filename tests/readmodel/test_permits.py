"""Flow control's fleet-wide counts (`readmodel/permits.py`), on SQLite and PostgreSQL: permits
never exceed their limit, even taken by many processes at once; a lease that ends frees its
permit; a request log never lets a window hold more than its most."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine

from readmodel.db import create_schema
from readmodel.permits import (
    permits_held,
    return_permits,
    settle_requests,
    sweep_stale_counts,
    take_permits,
    take_requests,
)

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=10)


def take(engine: Engine, scope: str, holder: str, limit: int, now: datetime = T0) -> bool:
    return take_permits(engine, [(scope, limit)], holder, now, LEASE) is None


def test_permits_stop_at_the_limit_and_come_back(engine: Engine) -> None:
    assert take(engine, "d", "a", 2)
    assert take(engine, "d", "b", 2)
    assert not take(engine, "d", "c", 2)
    assert take(engine, "other", "c", 2)  # scopes apart
    assert take(engine, "d", "a", 2)  # a holder renews its own
    return_permits(engine, ["d"], "a")
    assert take(engine, "d", "c", 2)
    assert permits_held(engine, "d", T0) == 2


def test_permits_of_several_scopes_are_taken_all_or_none(engine: Engine) -> None:
    both = [("dest", 2), ("dest/tenant-a", 1)]
    assert take_permits(engine, both, "a", T0, LEASE) is None
    # The tenant's one permit is out: nothing is taken, the destination's permit included.
    assert take_permits(engine, both, "b", T0, LEASE) == "dest/tenant-a"
    assert permits_held(engine, "dest", T0) == 1
    assert take_permits(engine, [("dest", 2), ("dest/tenant-b", 1)], "c", T0, LEASE) is None
    assert take_permits(engine, [("dest", 2), ("dest/tenant-c", 1)], "d", T0, LEASE) == "dest"
    return_permits(engine, ["dest", "dest/tenant-a"], "a")
    assert take_permits(engine, both, "b", T0, LEASE) is None


def test_a_lease_that_ends_frees_its_permit(engine: Engine) -> None:
    assert take(engine, "d", "killed", 1)
    assert not take(engine, "d", "b", 1, T0 + LEASE - timedelta(seconds=1))
    assert take(engine, "d", "b", 1, T0 + LEASE)


def test_many_takers_at_once_never_hold_more_than_the_limit(engine_factory: Any) -> None:
    engines: list[Engine] = [engine_factory("ledger") for _ in range(4)]
    create_schema(engines[0])

    def one(n: int) -> bool:
        return take(engines[n % 4], "d", f"h{n}", 3)

    with ThreadPoolExecutor(8) as pool:
        taken = list(pool.map(one, range(40)))
    assert sum(taken) == 3
    assert permits_held(engines[0], "d", T0) == 3


def take_request(
    engine: Engine, scope: str, windows: list[tuple[timedelta, int]], now: datetime
) -> timedelta:
    return take_requests(engine, [(scope, windows)], now)[0]


def test_a_request_log_holds_every_window_to_its_most(engine: Engine) -> None:
    windows = [(timedelta(seconds=1), 2), (timedelta(seconds=10), 3)]
    at = [T0, T0 + timedelta(seconds=0.2)]
    for now in at:
        assert take_request(engine, "d", windows, now) == timedelta(0)
    # The 1 s window is full: room once the first request is a second old.
    assert take_request(engine, "d", windows, T0 + timedelta(seconds=0.5)) == timedelta(seconds=0.5)
    assert take_request(engine, "d", windows, T0 + timedelta(seconds=1)) == timedelta(0)
    # Three in 10 s: the next one waits for the first to leave that window.
    assert take_request(engine, "d", windows, T0 + timedelta(seconds=3)) == timedelta(seconds=7)
    assert take_request(engine, "d", windows, T0 + timedelta(seconds=10)) == timedelta(0)
    assert take_request(engine, "e", windows, T0 + timedelta(seconds=3)) == timedelta(0)


def test_requests_of_several_scopes_are_recorded_all_or_none(engine: Engine) -> None:
    dest = ("dest", [(timedelta(seconds=10), 3)])
    tenant = ("dest/tenant-a", [(timedelta(seconds=10), 1)])
    assert take_requests(engine, [dest, tenant], T0)[0] == timedelta(0)
    # The tenant's window is full: the destination's request is not recorded either.
    assert take_requests(engine, [dest, tenant], T0) == (timedelta(seconds=10), [])
    other = ("dest/tenant-b", [(timedelta(seconds=10), 1)])
    assert take_requests(engine, [dest, other], T0)[0] == timedelta(0)
    assert take_requests(engine, [dest], T0)[0] == timedelta(0)
    assert take_requests(engine, [dest], T0)[0] == timedelta(seconds=10)  # three: full


def test_many_requesters_at_once_never_overfill_a_window(engine_factory: Any) -> None:
    engines: list[Engine] = [engine_factory("ledger") for _ in range(4)]
    create_schema(engines[0])
    windows = [(timedelta(seconds=60), 5)]

    def one(n: int) -> bool:
        return take_requests(engines[n % 4], [("d", windows)], T0)[0] == timedelta(0)

    with ThreadPoolExecutor(8) as pool:
        taken = list(pool.map(one, range(40)))
    assert sum(taken) == 5


def test_a_request_out_counts_at_its_latest_until_it_is_answered(engine: Engine) -> None:
    windows = [(timedelta(seconds=1), 1)]
    lease = T0 + timedelta(seconds=30)
    wait, ids = take_requests(engine, [("d", windows)], T0, pending_until=lease)
    assert wait == timedelta(0) and len(ids) == 1
    # Out still: however long ago it was let through, it fills the window.
    later = T0 + timedelta(seconds=5)
    assert take_request(engine, "d", windows, later) == timedelta(seconds=1)
    # Answered 0.2 s after it went: room a second after that.
    settle_requests(engine, ids, T0 + timedelta(seconds=0.2))
    at_one = T0 + timedelta(seconds=1)
    assert take_request(engine, "d", windows, at_one) == timedelta(seconds=0.2)
    assert take_request(engine, "d", windows, T0 + timedelta(seconds=1.2)) == timedelta(0)


def test_a_sweep_takes_counts_no_window_can_count_and_leaves_the_rest(engine: Engine) -> None:
    # A scope used once and never again (a tenant gone) keeps its rows, as does a holder that
    # died with its permit: nothing else would ever delete them.
    day = [(timedelta(days=1), 1000)]
    for n in range(3):
        take_request(engine, f"gone-{n}", day, T0)
    take_request(engine, "busy", day, T0 + timedelta(days=1, hours=2))
    assert take(engine, "dead-holder", "w1", 5)
    assert take(engine, "live-holder", "w2", 5, now=T0 + timedelta(days=1, hours=2))
    now = T0 + timedelta(days=1, hours=2)

    assert sweep_stale_counts(engine, now, limit=2) == 2 + 1  # two requests, the dead permit
    assert sweep_stale_counts(engine, now, limit=2) == 1
    assert sweep_stale_counts(engine, now, limit=2) == 0
    assert permits_held(engine, "live-holder", now) == 1
    # The busy scope's window still counts its request.
    assert take_request(engine, "busy", [(timedelta(days=1), 1)], now) > timedelta(0)
