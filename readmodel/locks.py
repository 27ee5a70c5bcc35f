"""A mutex shared by every process on one read model: a lease on a scope, kept as a permit of
one (`readmodel.permits`) in the read model's database.

A lease, not a lock held by an open transaction: on SQLite the only lock a transaction can hold
is the database's one write lock, which would stall every other writer (projections, permits)
for as long as the holder works, and deadlock the holder's own writes. A short transaction takes
the lease and another gives it back, so the database is free meanwhile on either engine; a holder
that dies loses it when the lease ends. Why: docs/decisions/destination-controls-lease.md
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from readmodel.permits import return_permits, take_permits

log = logging.getLogger("outbox.readmodel")

# How often a waiter asks again while the scope is held (jittered, so waiters do not march).
_RETRY_S = 0.02


class LockBusy(TimeoutError):
    """The scope stayed held by another holder for longer than the caller would wait."""


@contextlib.asynccontextmanager
async def held(
    engine: Engine, scope: str, *, lease: timedelta, wait: timedelta
) -> AsyncIterator[None]:
    """Hold `scope` against every process sharing `engine` for the block, waiting up to `wait`
    for it (`LockBusy` past that). The block must end within `lease`: past it another holder
    may take the scope. A read model that does not answer raises its error, before the block.
    """
    holder = f"lock-{uuid.uuid4()}"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait.total_seconds()
    while True:
        full = await asyncio.to_thread(
            take_permits, engine, [(scope, 1)], holder, datetime.now(UTC), lease
        )
        if full is None:
            break
        if loop.time() >= deadline:
            raise LockBusy(f"{scope} still held after {wait.total_seconds():g} s")
        await asyncio.sleep(_RETRY_S * (0.5 + random.random()))
    try:
        yield
    finally:
        try:
            await asyncio.to_thread(return_permits, engine, [scope], holder)
        except SQLAlchemyError as err:
            # The work is done; the scope frees itself when the lease ends.
            log.warning("%s not given back, free at the end of its lease: %s", scope, err)
