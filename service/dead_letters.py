"""Dead letters: list an outbox's failed items, discard one, redrive all a filter selects.

Redriving one is `ItemService.redrive` (through its lane where it is a halted lane's head). A
batch redrive is a `RedriveBatch` workflow: its pages run as activities on the operations worker
(`activities/redrive.py`), its progress is in its history and its `progress` query, so neither
an API restart nor a worker crash loses or repeats a page's work.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from durable_outbox_temporal import OutboxError, validate_key, validate_outbox
from durable_outbox_temporal.client import RPC_TIMEOUT
from durable_outbox_temporal.contract.dead_letters import (
    PROGRESS_QUERY,
    REDRIVE_BATCH_WORKFLOW_TYPE,
    DeadLetterFilter,
    RedriveBatchInput,
    RedriveBatchProgress,
)
from durable_outbox_temporal.contract.ids import item_workflow_id, redrive_batch_workflow_id
from durable_outbox_temporal.contract.item import ItemStatus
from durable_outbox_temporal.validation import validate_utc_date
from sqlalchemy import Engine
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from readmodel import store
from readmodel.dead_letters import DeadLetter, discard, list_dead_letters
from service.items import ItemService


class NotADeadLetter(OutboxError):
    """The item has not failed (or was redriven since): there is nothing to discard."""


class RedriveBatchNotFound(OutboxError):
    """No redrive batch with that id exists for the outbox."""


@dataclass
class RedriveBatch:
    """A batch as the API shows it: its id, what it selects and how far it is, and Temporal's
    word for the workflow (running, completed, failed, terminated...)."""

    id: str
    progress: RedriveBatchProgress
    state: str


class DeadLetterService:
    """The dead-letter use cases over one `ItemService` (its client and read model)."""

    def __init__(self, items: ItemService, operations_task_queue: str) -> None:
        self.items = items
        self.operations_task_queue = operations_task_queue

    @property
    def engine(self) -> Engine:
        return self.items.engine

    async def list(
        self,
        outbox: str,
        which: DeadLetterFilter,
        *,
        include_discarded: bool = False,
        cursor: str | None = None,
        limit: int = 50,
    ) -> tuple[list[DeadLetter], str | None]:
        validate_outbox(outbox)
        _validate_filter(which)
        return await asyncio.to_thread(
            list_dead_letters,
            self.engine,
            outbox,
            which,
            include_discarded=include_discarded,
            cursor=cursor,
            limit=limit,
        )

    async def discard(self, outbox: str, key: str, reason: str) -> DeadLetter:
        """Give up on a failed item: it leaves the dead-letter list and stays, with its history,
        in the read model. Raises `NotADeadLetter` unless the item has failed."""
        validate_outbox(outbox)
        validate_key(key)
        record = await asyncio.to_thread(store.get_item, self.engine, item_workflow_id(outbox, key))
        if record is None:
            await self.items.client.status(outbox, key)  # ItemNotFound for an unknown key
            raise NotADeadLetter("item has not failed; only failed items can be discarded")
        if record.view.status is not ItemStatus.FAILED:
            raise NotADeadLetter(
                f"item is {record.view.status.value}; only failed items can be discarded"
            )
        given_up = await asyncio.to_thread(
            discard,
            self.engine,
            outbox,
            record.view.id,
            record.view.last_event_seq,
            reason,
            datetime.now(UTC),
        )
        return DeadLetter(record, given_up)

    async def start_redrive(self, outbox: str, which: DeadLetterFilter) -> RedriveBatch:
        """Start a batch that redrives every dead letter the filter selects, failed before now
        (discarded ones excepted); answers at once with the batch to follow."""
        validate_outbox(outbox)
        _validate_filter(which)
        batch_id = uuid.uuid4().hex
        progress = RedriveBatchProgress(outbox, which)
        client = self.items.client
        temporal = await client.temporal()
        await temporal.start_workflow(
            REDRIVE_BATCH_WORKFLOW_TYPE,
            RedriveBatchInput(self.operations_task_queue, progress),
            id=redrive_batch_workflow_id(outbox, batch_id),
            task_queue=client.task_queue,
            static_summary=f"Redrive the dead letters of {outbox}",
            rpc_timeout=RPC_TIMEOUT,
        )
        return RedriveBatch(batch_id, progress, WorkflowExecutionStatus.RUNNING.name.lower())

    async def batch(self, outbox: str, batch_id: str) -> RedriveBatch:
        """A batch's progress: its result once done, else asked of the workflow."""
        validate_outbox(outbox)
        temporal = await self.items.client.temporal()
        handle = temporal.get_workflow_handle(
            redrive_batch_workflow_id(outbox, batch_id), result_type=RedriveBatchProgress
        )
        try:
            description = await handle.describe(rpc_timeout=RPC_TIMEOUT)
        except RPCError as err:
            if err.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
                raise RedriveBatchNotFound(f"no redrive batch {batch_id!r} in {outbox}") from None
            raise
        if description.workflow_type != REDRIVE_BATCH_WORKFLOW_TYPE:
            raise RedriveBatchNotFound(f"no redrive batch {batch_id!r} in {outbox}")
        status = description.status or WorkflowExecutionStatus.RUNNING
        if status == WorkflowExecutionStatus.COMPLETED:
            progress = await handle.result(rpc_timeout=RPC_TIMEOUT)
        else:
            # A closed (failed, terminated) batch answers too: a worker replays it to its end.
            progress = await handle.query(
                PROGRESS_QUERY, result_type=RedriveBatchProgress, rpc_timeout=RPC_TIMEOUT
            )
            if progress.done and status == WorkflowExecutionStatus.RUNNING:
                # It returned between the describe and the query: done means completed.
                status = WorkflowExecutionStatus.COMPLETED
        return RedriveBatch(batch_id, progress, status.name.lower())


def _validate_filter(which: DeadLetterFilter) -> None:
    # A date no query can hold would fail the query, or every page of a batch, not the request.
    if which.failed_from is not None:
        validate_utc_date(which.failed_from, "failed_from")
    if which.failed_to is not None:
        validate_utc_date(which.failed_to, "failed_to")
