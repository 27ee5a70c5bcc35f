"""Reads and idempotent writes of the ordering lanes' rows (`outbox_lanes`).

A lane's row only moves forward in `version` (the lane counts every change, from the moment it
last started), so a retried or replayed projection never takes it back, and a lane that ended
and started again moves it on.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

from durable_outbox_temporal.contract.ids import lane_workflow_id
from durable_outbox_temporal.contract.lane import LaneProjection, LaneStatus, LaneView
from sqlalchemy import Engine, Executable, select
from sqlalchemy.dialects import postgresql, sqlite

from readmodel.models import LANES, read_lane
from readmodel.store import MAX_PAGE, apply_projections

_LANE_COLUMNS = tuple(column.name for column in LANES.c if column.name != "id")


def apply_lane_projections(engine: Engine, projections: Sequence[LaneProjection]) -> None:
    """Write the lanes' own item transitions, then each lane's row if it is newer than the
    stored one."""
    apply_projections(engine, [item for projection in projections for item in projection.items])
    with engine.begin() as connection:
        for projection in projections:
            connection.execute(
                _upsert_lane(engine.dialect.name), dataclasses.asdict(projection.lane)
            )


@functools.cache
def _upsert_lane(dialect: str) -> Executable:
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    upsert = insert(LANES)
    return upsert.on_conflict_do_update(
        index_elements=["id"],
        set_={name: upsert.excluded[name] for name in _LANE_COLUMNS},
        where=LANES.c.version < upsert.excluded.version,
    )


def get_lane(engine: Engine, outbox: str, ordering_key: str) -> LaneView | None:
    """The lane's last projected view, or None if it never ran."""
    with engine.connect() as connection:
        row = (
            connection.execute(
                select(LANES).where(LANES.c.id == lane_workflow_id(outbox, ordering_key))
            )
            .mappings()
            .first()
        )
    return read_lane(row) if row is not None else None


def list_lanes(
    engine: Engine,
    outbox: str,
    *,
    status: LaneStatus | None = None,
    after: str | None = None,
    limit: int = 50,
) -> tuple[list[LaneView], str | None]:
    """A page of the outbox's lanes by ordering key, and the key to continue after (or None)."""
    limit = max(1, min(limit, MAX_PAGE))
    query = select(LANES).where(LANES.c.outbox == outbox)
    if status is not None:
        query = query.where(LANES.c.status == status.value)
    if after is not None:
        query = query.where(LANES.c.ordering_key > after)
    query = query.order_by(LANES.c.ordering_key).limit(limit + 1)
    with engine.connect() as connection:
        rows = [read_lane(row) for row in connection.execute(query).mappings()]
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, rows[-1].ordering_key if more else None
