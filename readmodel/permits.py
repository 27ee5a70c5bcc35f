"""Fleet-wide counts for flow control, kept in the read model's database: concurrency permits
(at most N requests out at once for a scope) and request logs (at most N requests in any
sliding window of a scope), exact across every worker process that shares the database.

Temporal has neither: its task-queue rate is a token bucket split across the queue's
partitions, and nothing caps activities in flight across workers (temporal#196). Each call
here is one short transaction that first takes a lock on its scope (an advisory lock on
PostgreSQL; SQLite serializes writers by itself), so two processes never both see room for the
last slot. Why the database: docs/decisions/flow-ledger.md
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from durable_outbox_temporal.contract.flow_policy import MAX_WINDOW
from sqlalchemy import Engine, delete, func, insert, select, update

from readmodel.db import lock_scopes
from readmodel.models import FLOW_PERMITS, FLOW_REQUESTS


def take_permits(
    engine: Engine,
    scopes: Sequence[tuple[str, int]],
    holder: str,
    now: datetime,
    lease: timedelta,
) -> str | None:
    """Take one permit of each scope (`scope`, `limit`) for `holder` until `now + lease` (a
    holder that dies without returning them loses them then), all or none: None when taken,
    else the first scope that was full. Taking them again renews them."""
    if not scopes:
        return None
    with engine.begin() as connection:
        lock_scopes(connection, (scope for scope, _ in scopes))
        for scope, limit in scopes:
            connection.execute(
                delete(FLOW_PERMITS).where(
                    FLOW_PERMITS.c.scope == scope,
                    (FLOW_PERMITS.c.expires_at <= now) | (FLOW_PERMITS.c.holder == holder),
                )
            )
            held = connection.execute(
                select(func.count()).select_from(FLOW_PERMITS).where(FLOW_PERMITS.c.scope == scope)
            ).scalar_one()
            if held >= limit:
                connection.rollback()
                return scope
        connection.execute(
            insert(FLOW_PERMITS),
            [{"scope": scope, "holder": holder, "expires_at": now + lease} for scope, _ in scopes],
        )
        return None


def return_permits(engine: Engine, scopes: Sequence[str], holder: str) -> None:
    with engine.begin() as connection:
        connection.execute(
            delete(FLOW_PERMITS).where(
                FLOW_PERMITS.c.scope.in_(scopes), FLOW_PERMITS.c.holder == holder
            )
        )


def permits_held(engine: Engine, scope: str, now: datetime) -> int:
    with engine.connect() as connection:
        return int(
            connection.execute(
                select(func.count())
                .select_from(FLOW_PERMITS)
                .where(FLOW_PERMITS.c.scope == scope, FLOW_PERMITS.c.expires_at > now)
            ).scalar_one()
        )


Windows = Sequence[tuple[timedelta, int]]


def take_requests(
    engine: Engine,
    scopes: Sequence[tuple[str, Windows]],
    now: datetime,
    pending_until: datetime | None = None,
) -> tuple[timedelta, list[int]]:
    """Record one request in each scope if every window (`per`, `max`) of every scope has room
    for it at `now`: (zero, the ids of its rows); else record nothing: (how long until there
    would be room at the soonest, []).

    A request is recorded at `pending_until` (default `now`) until `settle_requests` gives it
    the time it was answered: the time it reaches the provider lies between the two, so
    counting it at its latest keeps every window the provider sees within its most."""
    scopes = [(scope, windows) for scope, windows in scopes if windows]
    if not scopes:
        return timedelta(0), []
    wait = timedelta(0)
    with engine.begin() as connection:
        lock_scopes(connection, (scope for scope, _ in scopes))
        for scope, windows in scopes:
            longest = max(per for per, _ in windows)
            connection.execute(
                delete(FLOW_REQUESTS).where(
                    FLOW_REQUESTS.c.scope == scope, FLOW_REQUESTS.c.at <= now - longest
                )
            )
            for per, most in windows:
                # The window's newest `most`: the oldest of them must leave it to make room.
                newest = list(
                    connection.execute(
                        select(FLOW_REQUESTS.c.at)
                        .where(FLOW_REQUESTS.c.scope == scope, FLOW_REQUESTS.c.at > now - per)
                        .order_by(FLOW_REQUESTS.c.at.desc())
                        .limit(most)
                    ).scalars()
                )
                if len(newest) >= most:
                    # A request still out counts at its latest: room comes a window later at
                    # most (it may come sooner, once it is answered).
                    wait = max(wait, min(newest[most - 1] + per - now, per))
        if wait > timedelta(0):
            return wait, []
        at = pending_until or now
        ids = [
            connection.execute(
                insert(FLOW_REQUESTS).values(scope=scope, at=at).returning(FLOW_REQUESTS.c.id)
            ).scalar_one()
            for scope, _ in scopes
        ]
        return timedelta(0), ids


def settle_requests(engine: Engine, ids: Sequence[int], answered_at: datetime) -> None:
    """The requests of `ids` were answered at `answered_at`: they count from then."""
    if not ids:
        return
    with engine.begin() as connection:
        connection.execute(
            update(FLOW_REQUESTS).where(FLOW_REQUESTS.c.id.in_(ids)).values(at=answered_at)
        )


def scopes_full(
    engine: Engine, scopes: Sequence[tuple[str, int]], prefix: tuple[str, int] | None, now: datetime
) -> list[str]:
    """Which of `scopes` (`scope`, `limit`), and which scopes under `prefix` (`scope/`, with one
    limit for each), have every permit out now: what holds requests waiting for one."""
    found = []
    with engine.connect() as connection:
        held = (
            select(FLOW_PERMITS.c.scope, func.count().label("held"))
            .where(FLOW_PERMITS.c.expires_at > now)
            .group_by(FLOW_PERMITS.c.scope)
        )
        for scope, limit in scopes:
            count = connection.execute(held.where(FLOW_PERMITS.c.scope == scope)).one_or_none()
            if count is not None and count.held >= limit:
                found.append(scope)
        if prefix is not None:
            under, limit = prefix
            rows = connection.execute(
                held.where(FLOW_PERMITS.c.scope.startswith(f"{under}/", autoescape=True))
                .having(func.count() >= limit)
                .order_by(FLOW_PERMITS.c.scope)
            )
            found.extend(row.scope for row in rows)
    return found


def windows_full(
    engine: Engine,
    scopes: Sequence[tuple[str, Windows]],
    prefix: tuple[str, Windows] | None,
    now: datetime,
) -> list[str]:
    """Which of `scopes`, and which scopes under `prefix`, have a window (`per`, `max`) with no
    room for a request now."""
    found = []
    with engine.connect() as connection:
        for scope, windows in scopes:
            for per, most in windows:
                count = connection.execute(
                    select(func.count())
                    .select_from(FLOW_REQUESTS)
                    .where(FLOW_REQUESTS.c.scope == scope, FLOW_REQUESTS.c.at > now - per)
                ).scalar_one()
                if count >= most:
                    found.append(scope)
                    break
        if prefix is not None:
            under, windows = prefix
            full: set[str] = set()
            for per, most in windows:
                rows = connection.execute(
                    select(FLOW_REQUESTS.c.scope)
                    .where(
                        FLOW_REQUESTS.c.scope.startswith(f"{under}/", autoescape=True),
                        FLOW_REQUESTS.c.at > now - per,
                    )
                    .group_by(FLOW_REQUESTS.c.scope)
                    .having(func.count() >= most)
                )
                full.update(row.scope for row in rows)
            found.extend(sorted(full))
    return found


# What a sweep leaves beyond the longest window: a clock a little behind another's still counts.
SWEEP_MARGIN = timedelta(hours=1)


def sweep_stale_counts(engine: Engine, now: datetime, limit: int) -> int:
    """Delete counts no window can count any more: requests older than the longest quota
    window (`MAX_WINDOW`), at most `limit`, oldest first, and permits whose lease ended. A
    scope's own calls delete its old rows as they go; this reaches the scopes never used again
    (a tenant gone, a concurrency key per order), and the permits of holders that died. Returns
    how many rows went."""
    with engine.begin() as connection:
        oldest = (
            select(FLOW_REQUESTS.c.id)
            .where(FLOW_REQUESTS.c.at < now - MAX_WINDOW - SWEEP_MARGIN)
            .order_by(FLOW_REQUESTS.c.at)
            .limit(limit)
            .scalar_subquery()
        )
        requests = connection.execute(delete(FLOW_REQUESTS).where(FLOW_REQUESTS.c.id.in_(oldest)))
        permits = connection.execute(
            delete(FLOW_PERMITS).where(FLOW_PERMITS.c.expires_at < now - SWEEP_MARGIN)
        )
    return requests.rowcount + permits.rowcount
