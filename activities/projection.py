"""The projection activities: the item and lane workflows write their transitions to the SQL
read model."""

from __future__ import annotations

import asyncio
import functools
from datetime import UTC, datetime

from durable_outbox_temporal.contract.bulk import (
    PROJECT_ITEMS_ACTIVITY,
    RECORD_LATE_REPORTS_ACTIVITY,
    ItemReport,
)
from durable_outbox_temporal.contract.item import PROJECT_ACTIVITY, ItemProjection
from durable_outbox_temporal.contract.lane import PROJECT_LANES_ACTIVITY, LaneProjection
from sqlalchemy import Engine
from temporalio import activity

from readmodel.delivery_reports import record_late_report
from readmodel.lanes import apply_lane_projections
from readmodel.writer import MAX_BATCH, ProjectionWriter


class ProjectionActivities:
    """Run as local activities on the workflow worker, so a transition costs no extra task.

    Projections from all the worker's workflows go through one `ProjectionWriter` (group
    commit), shared with the process's submit and poll activities."""

    def __init__(
        self,
        engine: Engine,
        max_batch: int = MAX_BATCH,
        *,
        writer: ProjectionWriter | None = None,
    ) -> None:
        self.writer = writer or ProjectionWriter(engine, max_batch)

    @property
    def transactions(self) -> int:
        """How many transactions the writer committed (the tests check the batching)."""
        return self.writer.transactions

    @activity.defn(name=PROJECT_ACTIVITY)
    async def project_item(self, projection: ItemProjection) -> None:
        """Idempotent: a retried or replayed projection leaves the read model unchanged."""
        await self.writer.write(projection)

    @activity.defn(name=PROJECT_ITEMS_ACTIVITY)
    async def project_items(self, projections: list[ItemProjection]) -> None:
        """A bulk shard's batch of items' transitions; idempotent like `project_item`."""
        await asyncio.gather(*(self.writer.write(projection) for projection in projections))

    @activity.defn(name=PROJECT_LANES_ACTIVITY)
    async def project_lanes(self, projections: list[LaneProjection]) -> None:
        """Lanes' rows and the transitions they made for their waiting items; idempotent.

        On the writer's thread, so it never runs beside an item's write of the same rows."""
        await self.writer.run(functools.partial(apply_lane_projections, projections=projections))

    @activity.defn(name=RECORD_LATE_REPORTS_ACTIVITY)
    async def record_late_reports(self, reports: list[ItemReport]) -> int:
        """Delivery reports a shard or a lane got for items it no longer holds (their report
        window is over), each recorded in its item's read-model row
        (`readmodel/delivery_reports.py`); how many changed a recipient. Idempotent: a repeat
        changes nothing."""
        now = datetime.now(UTC)

        def record(engine: Engine) -> int:
            return sum(
                record_late_report(engine, None, late.item_id, late.report, now) for late in reports
            )

        return await self.writer.run(record)
