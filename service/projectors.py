"""Async projectors for the API and the worker: status, rebuild and rows from the read model,
and starting each projector's workflow (idempotent: a running one is left alone)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from durable_outbox_temporal.contract.projector import (
    WORKFLOW_TYPE,
    ProjectorInput,
    projector_workflow_id,
)
from sqlalchemy import Engine
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy

from readmodel.projectors import base as projectors
from readmodel.projectors.base import AsyncProjector, ProjectorStatus, UnknownProjector


class ProjectorService:
    """The projectors of `registry` (the registered aggregate types', by name)."""

    def __init__(self, engine: Engine, registry: Mapping[str, AsyncProjector]) -> None:
        self.engine = engine
        self.registry = dict(registry)

    def get(self, name: str) -> AsyncProjector:
        projector = self.registry.get(name)
        if projector is None:
            known = ", ".join(sorted(self.registry)) or "none"
            raise UnknownProjector(f"no projector {name!r} (known: {known})")
        return projector

    async def statuses(self) -> list[ProjectorStatus]:
        return [await self.status(name) for name in sorted(self.registry)]

    async def status(self, name: str) -> ProjectorStatus:
        return await asyncio.to_thread(projectors.status, self.engine, self.get(name))

    async def rebuild(self, name: str) -> ProjectorStatus:
        """Empty its read model and start it over from the first event; its runner picks the
        reset checkpoint up on its next batch."""
        await asyncio.to_thread(projectors.rebuild, self.engine, self.get(name))
        return await self.status(name)

    async def rows(
        self, name: str, filters: Mapping[str, str], *, after: str | None, limit: int
    ) -> tuple[list[dict[str, Any]], str | None]:
        return await asyncio.to_thread(
            projectors.rows, self.engine, self.get(name), filters, after=after, limit=limit
        )


async def start_projectors(
    client: Client,
    workflow_task_queue: str,
    operations_task_queue: str,
    names: Iterable[str],
) -> None:
    """Start each projector's workflow unless it runs already (every worker may call this)."""
    for name in names:
        await client.start_workflow(
            WORKFLOW_TYPE,
            ProjectorInput(name=name, operations_task_queue=operations_task_queue),
            id=projector_workflow_id(name),
            task_queue=workflow_task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            static_summary=f"projector {name}: aggregate events → read model",
        )
