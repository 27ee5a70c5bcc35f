"""The projection activity: the item workflow writes each transition to the SQL read model."""

from __future__ import annotations

import asyncio

from sqlalchemy import Engine
from temporalio import activity

from common.models import ItemProjection
from readmodel.store import apply_projection
from workflows.outbox_item import PROJECT_ACTIVITY


class ProjectionActivities:
    """Runs as a local activity on the workflow worker, so a transition costs no extra task."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    @activity.defn(name=PROJECT_ACTIVITY)
    async def project_item(self, projection: ItemProjection) -> None:
        """Idempotent: a retried or replayed projection leaves the read model unchanged."""
        # The DB driver blocks; a thread keeps the worker's event loop free for other tasks.
        await asyncio.to_thread(apply_projection, self._engine, projection)
