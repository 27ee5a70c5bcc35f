"""Erasure by filter: start an `EraseBatch` over an outbox's items with a key prefix, or over
those enqueued for one subject, and follow it.

The batch runs on the operations worker (`workflows/erase_batch.py`, `activities/erasure.py`);
its progress lives in Temporal, so any API instance answers for it. Erasing one item is
`DELETE .../items/{key}/payload` (`api/routes/attempts.py`); both erase through
`readmodel.erasure`.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

from durable_outbox_temporal import InvalidRequest, OutboxError, validate_outbox
from durable_outbox_temporal.client import RPC_TIMEOUT
from durable_outbox_temporal.contract.erasure import (
    ERASE_BATCH_WORKFLOW_TYPE,
    EraseBatchInput,
    EraseBatchProgress,
    erase_batch_workflow_id,
)
from temporalio.client import WorkflowExecutionStatus

from readmodel import subjects
from service.items import ItemService, follow_batch


class EraseBatchNotFound(OutboxError):
    """No erase batch with that id exists for the outbox."""


@dataclass
class EraseBatch:
    """An erase batch as the API shows it: its id, how far it is, and Temporal's word for its
    workflow (running, completed, failed, terminated...)."""

    id: str
    progress: EraseBatchProgress
    state: str


async def start_erase(
    items: ItemService,
    operations_task_queue: str,
    outbox: str,
    *,
    key_prefix: str | None = None,
    subject: str | None = None,
) -> EraseBatch:
    """Start a batch erasing the outbox's ended items whose key starts with `key_prefix`, or
    that were enqueued for `subject` (exactly one of the two); answers at once."""
    validate_outbox(outbox)
    if (key_prefix is None) == (subject is None):
        raise InvalidRequest("give key_prefix or subject, exactly one")
    digest = None
    if subject is not None:
        [digest] = await asyncio.to_thread(subjects.digests, items.engine, [subject])
    batch_id = uuid.uuid4().hex
    progress = EraseBatchProgress(outbox, key_prefix=key_prefix, subject_digest=digest)
    temporal = await items.client.temporal()
    await temporal.start_workflow(
        ERASE_BATCH_WORKFLOW_TYPE,
        EraseBatchInput(operations_task_queue, progress),
        id=erase_batch_workflow_id(outbox, batch_id),
        task_queue=items.client.task_queue,
        static_summary=f"Erase items of {outbox}",
        rpc_timeout=RPC_TIMEOUT,
    )
    return EraseBatch(batch_id, progress, WorkflowExecutionStatus.RUNNING.name.lower())


async def erase_batch(items: ItemService, outbox: str, batch_id: str) -> EraseBatch:
    """An erase batch's progress; `EraseBatchNotFound` for an id no erase of the outbox has."""
    validate_outbox(outbox)
    temporal = await items.client.temporal()
    found = await follow_batch(
        temporal,
        erase_batch_workflow_id(outbox, batch_id),
        ERASE_BATCH_WORKFLOW_TYPE,
        EraseBatchProgress,
    )
    if found is None:
        raise EraseBatchNotFound(f"no erase batch {batch_id!r} in {outbox}")
    progress, state = found
    return EraseBatch(batch_id, progress, state)
