"""The projection activity: the item workflow writes each transition to the SQL read model."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError
from temporalio import activity

from contract.item import PROJECT_ACTIVITY, ItemProjection
from contract.lane import PROJECT_LANE_ACTIVITY, LaneProjection
from readmodel.lanes import apply_lane_projection
from readmodel.store import apply_projections

log = logging.getLogger("outbox.projection")

# Bounded so one transaction stays well under SQLite's limit of bound parameters per statement.
MAX_BATCH = 200

_Pending = tuple[ItemProjection, "asyncio.Future[None]"]


class ProjectionActivities:
    """Runs as a local activity on the workflow worker, so a transition costs no extra task.

    Projections from all the worker's workflows go through one writer (group commit): while a
    transaction is being written, the next projections gather and are written together in the
    next one. Each activity still completes only once its own projection is committed.
    """

    def __init__(self, engine: Engine, max_batch: int = MAX_BATCH) -> None:
        self._engine = engine
        self._max_batch = max_batch
        self._pending: list[_Pending] = []
        self._writer: asyncio.Task[None] | None = None
        # One thread: the DB driver blocks, and one writer at a time is what batches the rest.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="projection")
        self.transactions = 0  # how well the batching works (the tests check it)

    @activity.defn(name=PROJECT_ACTIVITY)
    async def project_item(self, projection: ItemProjection) -> None:
        """Idempotent: a retried or replayed projection leaves the read model unchanged."""
        done = asyncio.get_running_loop().create_future()
        self._pending.append((projection, done))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_pending())
        await done

    @activity.defn(name=PROJECT_LANE_ACTIVITY)
    async def project_lane(self, projection: LaneProjection) -> None:
        """A lane's row and the transitions it made for its waiting items; idempotent.

        On the writer's thread, so it never runs beside an item's write of the same rows."""
        await asyncio.get_running_loop().run_in_executor(
            self._thread, apply_lane_projection, self._engine, projection
        )

    async def _write_pending(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            batch = self._pending[: self._max_batch]
            del self._pending[: self._max_batch]
            try:
                await loop.run_in_executor(
                    self._thread, apply_projections, self._engine, [p for p, _ in batch]
                )
                self.transactions += 1
                _settle(batch, None)
            except OperationalError as err:
                # The database is down or locked: every projection would fail alike, so all the
                # activities fail now and retry on their own schedule.
                _settle(batch, err)
            except Exception as err:
                if len(batch) == 1:
                    _settle(batch, err)
                    continue
                # One bad projection must not fail the others' activities: write them one by
                # one, so each activity gets its own outcome (and only the bad one retries).
                log.warning("batch of %d projections failed (%s); writing singly", len(batch), err)
                for pending in batch:
                    try:
                        await loop.run_in_executor(
                            self._thread, apply_projections, self._engine, [pending[0]]
                        )
                        self.transactions += 1
                        _settle([pending], None)
                    except Exception as single_err:
                        _settle([pending], single_err)


def _settle(batch: list[_Pending], error: Exception | None) -> None:
    for _, done in batch:
        # An activity that timed out or was cancelled meanwhile has no one waiting any more.
        if done.done():
            continue
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)
