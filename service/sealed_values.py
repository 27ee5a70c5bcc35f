"""Sealed values' use cases: how many stored values each payload key seals, and the reseal
batch that moves them all under the newest key (`workflows/reseal_batch.py`)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from durable_outbox_temporal import OutboxClient, OutboxError
from durable_outbox_temporal.client import RPC_TIMEOUT
from durable_outbox_temporal.contract.reseal import (
    RESEAL_BATCH_WORKFLOW_TYPE,
    ResealBatchInput,
    ResealBatchProgress,
    reseal_batch_workflow_id,
)
from durable_outbox_temporal.contract.sealed_columns import keys_of
from sqlalchemy import Engine, Table
from temporalio.client import WorkflowExecutionStatus

from readmodel.reseal import NoPayloadKeys, SealedCounts, sealed_counts
from service.items import follow_batch


class ResealBatchNotFound(OutboxError):
    """No reseal batch with that id exists."""


class ResealNeedsKeys(OutboxError):
    """A reseal was asked of a service without payload keys."""


@dataclass
class ResealBatch:
    """A reseal batch as the API shows it: its id, how far it is, and Temporal's word for the
    workflow (running, completed, failed, terminated...)."""

    id: str
    progress: ResealBatchProgress
    state: str


@dataclass
class KeyUse:
    """The current key, every configured key id, and the stored values under each."""

    current: str | None
    configured: list[str]
    counts: SealedCounts


class SealedValueService:
    """The sealed values of one read model (`tables`), over one `OutboxClient`."""

    def __init__(self, client: OutboxClient, engine: Engine, tables: Sequence[Table]) -> None:
        self.client = client
        self.engine = engine
        self.tables = list(tables)

    async def key_use(self) -> KeyUse:
        """The stored values under each configured key, under any other key id, and plain."""
        keys = keys_of(self.engine)
        key_ids = keys.key_ids if keys is not None else []
        counts = await asyncio.to_thread(sealed_counts, self.engine, self.tables, key_ids)
        return KeyUse(keys.current if keys is not None else None, key_ids, counts)

    async def start_reseal(self, operations_task_queue: str) -> ResealBatch:
        """Start a batch that seals every stored value again under the current key; answers at
        once with the batch to follow (`reseal_batch`)."""
        keys = keys_of(self.engine)
        if keys is None:
            raise ResealNeedsKeys(str(NoPayloadKeys()))
        batch_id = uuid.uuid4().hex
        progress = ResealBatchProgress(key_id=keys.current)
        temporal = await self.client.temporal()
        await temporal.start_workflow(
            RESEAL_BATCH_WORKFLOW_TYPE,
            ResealBatchInput(operations_task_queue, progress),
            id=reseal_batch_workflow_id(batch_id),
            task_queue=self.client.task_queue,
            static_summary=f"Reseal the read model under key {keys.current}",
            rpc_timeout=RPC_TIMEOUT,
        )
        return ResealBatch(batch_id, progress, WorkflowExecutionStatus.RUNNING.name.lower())

    async def reseal_batch(self, batch_id: str) -> ResealBatch:
        """A reseal batch's progress; `ResealBatchNotFound` for an id no reseal has."""
        temporal = await self.client.temporal()
        found = await follow_batch(
            temporal,
            reseal_batch_workflow_id(batch_id),
            RESEAL_BATCH_WORKFLOW_TYPE,
            ResealBatchProgress,
        )
        if found is None:
            raise ResealBatchNotFound(f"no reseal batch {batch_id!r}")
        progress, state = found
        return ResealBatch(batch_id, progress, state)
