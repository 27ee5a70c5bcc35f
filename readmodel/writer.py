"""One writer per process for item projections: group commit on one thread.

The item workflows' local activities, the submit and poll activities that project their own
transitions, and the API writing `queued` rows all hand their projections to it. While a
transaction is being written, the next projections gather and are written together in the next
one; each caller still returns only once its own projection is committed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from durable_outbox_temporal.contract.item import ItemProjection
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from readmodel.store import apply_projections

log = logging.getLogger("outbox.projection")

# Bounded so one transaction stays well under SQLite's limit of bound parameters per statement.
MAX_BATCH = 200

T = TypeVar("T")
_Pending = tuple[ItemProjection, "asyncio.Future[None]"]


class ProjectionWriter:
    """Group-commits item projections to `engine` (idempotent by item and event seq)."""

    def __init__(self, engine: Engine, max_batch: int = MAX_BATCH) -> None:
        self.engine = engine
        self._max_batch = max_batch
        self._pending: list[_Pending] = []
        self._writer: asyncio.Task[None] | None = None
        # One thread: the DB driver blocks, and one writer at a time is what batches the rest.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="projection")
        self.transactions = 0  # how well the batching works (the tests check it)

    async def write(self, projection: ItemProjection) -> None:
        """Return once `projection` is committed; raises what its transaction raised."""
        done = asyncio.get_running_loop().create_future()
        self._pending.append((projection, done))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_pending())
        await done

    async def run(self, write: Callable[[Engine], T]) -> T:
        """Run another write on the writer's thread, so it never runs beside a projection of
        the same rows."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, write, self.engine)

    async def _write_pending(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            batch = self._pending[: self._max_batch]
            del self._pending[: self._max_batch]
            try:
                await loop.run_in_executor(
                    self._thread, apply_projections, self.engine, [p for p, _ in batch]
                )
                self.transactions += 1
                _settle(batch, None)
            except OperationalError as err:
                # The database is down or locked: every projection would fail alike, so all the
                # callers fail now and retry on their own schedule.
                _settle(batch, err)
            except Exception as err:
                if len(batch) == 1:
                    _settle(batch, err)
                    continue
                # One bad projection must not fail the others: write them one by one, so each
                # caller gets its own outcome (and only the bad one retries).
                log.warning("batch of %d projections failed (%s); writing singly", len(batch), err)
                for pending in batch:
                    try:
                        await loop.run_in_executor(
                            self._thread, apply_projections, self.engine, [pending[0]]
                        )
                        self.transactions += 1
                        _settle([pending], None)
                    except Exception as single_err:
                        _settle([pending], single_err)


def _settle(batch: list[_Pending], error: Exception | None) -> None:
    for _, done in batch:
        # A caller that timed out or was cancelled meanwhile has no one waiting any more.
        if done.done():
            continue
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)
