"""Replays: send again, as new items to a target destination, the items a filter selects.

A replay is a `ReplayBatch` workflow (`workflows/replay_batch.py`) whose pages run on the
operations worker (`activities/replay.py`); this module starts one, after counting what its
filter selects against the confirmation threshold, and follows it (`service.items.follow_batch`).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

from durable_outbox_temporal import InvalidRequest, OutboxError, UnknownDestination
from durable_outbox_temporal.client import RPC_TIMEOUT
from durable_outbox_temporal.contract.item import ItemStatus
from durable_outbox_temporal.contract.replay import (
    REPLAY_BATCH_WORKFLOW_TYPE,
    ReplayBatchInput,
    ReplayBatchProgress,
    ReplayFilter,
    replay_batch_workflow_id,
)
from durable_outbox_temporal.validation import validate_key, validate_outbox, validate_utc_date
from temporalio.client import WorkflowExecutionStatus

from readmodel import store
from service.items import ItemService, follow_batch


class ReplayNotFound(OutboxError):
    """No replay with that id exists for the outbox."""


class ReplayNeedsConfirmation(OutboxError):
    """The filter selects more items than a replay takes unconfirmed; `count` is how many."""

    def __init__(self, message: str, count: int) -> None:
        super().__init__(message)
        self.count = count


@dataclass
class Replay:
    """A replay as the API shows it: its id, what it selects, where to, how far it is, and
    Temporal's word for the workflow (running, completed, failed, terminated...)."""

    id: str
    progress: ReplayBatchProgress
    state: str


class ReplayService:
    """The replay use cases over one `ItemService` (its client and read model)."""

    def __init__(self, items: ItemService, operations_task_queue: str, confirm_over: int) -> None:
        self.items = items
        self.operations_task_queue = operations_task_queue
        # A replay of more items than this needs `confirm_count` to say how many.
        self.confirm_over = confirm_over

    async def count(self, outbox: str, which: ReplayFilter) -> int:
        """How many items of the outbox the filter selects now."""
        validate_outbox(outbox)
        _validate_filter(which)
        return await asyncio.to_thread(
            store.count_items,
            self.items.engine,
            outbox,
            statuses=which.statuses,
            destination=which.destination,
            key_prefix=which.key_prefix,
            created_from=which.created_from,
            created_to=which.created_to,
        )

    async def start(
        self, outbox: str, which: ReplayFilter, target: str, confirm_count: int | None = None
    ) -> Replay:
        """Start a replay of the items the filter selects to `target`; answers at once with the
        batch to follow. Raises `UnknownDestination` for a target not configured, and
        `ReplayNeedsConfirmation` past the threshold unless `confirm_count` is the count."""
        if self.items.client.destinations.get(target) is None:
            raise UnknownDestination(f"unknown target destination {target!r}")
        count = await self.count(outbox, which)
        if count > self.confirm_over and confirm_count != count:
            raise ReplayNeedsConfirmation(
                f"the filter selects {count} items, more than {self.confirm_over}:"
                f" send confirm_count={count} to replay them",
                count,
            )
        replay_id = uuid.uuid4().hex
        progress = ReplayBatchProgress(outbox, which, target)
        client = self.items.client
        temporal = await client.temporal()
        await temporal.start_workflow(
            REPLAY_BATCH_WORKFLOW_TYPE,
            ReplayBatchInput(self.operations_task_queue, replay_id, progress),
            id=replay_batch_workflow_id(outbox, replay_id),
            task_queue=client.task_queue,
            static_summary=f"Replay items of {outbox} to {target}",
            rpc_timeout=RPC_TIMEOUT,
        )
        return Replay(replay_id, progress, WorkflowExecutionStatus.RUNNING.name.lower())

    async def get(self, outbox: str, replay_id: str) -> Replay:
        """A replay's progress; `ReplayNotFound` for an id no replay of the outbox has."""
        validate_outbox(outbox)
        temporal = await self.items.client.temporal()
        found = await follow_batch(
            temporal,
            replay_batch_workflow_id(outbox, replay_id),
            REPLAY_BATCH_WORKFLOW_TYPE,
            ReplayBatchProgress,
        )
        if found is None:
            raise ReplayNotFound(f"no replay {replay_id!r} in {outbox}")
        progress, state = found
        return Replay(replay_id, progress, state)


def _validate_filter(which: ReplayFilter) -> None:
    # A date no query can hold would fail the count, or every page of the batch.
    if which.created_from is not None:
        which.created_from = validate_utc_date(which.created_from, "created_from")
    if which.created_to is not None:
        which.created_to = validate_utc_date(which.created_to, "created_to")
    if (
        which.created_from is not None
        and which.created_to is not None
        and which.created_from >= which.created_to
    ):
        raise InvalidRequest("created_from must be before created_to: the range is empty")
    for status in which.statuses or ():
        if status not in {known.value for known in ItemStatus}:
            raise InvalidRequest(f"unknown status {status!r}")
    if which.key_prefix is not None:
        validate_key(which.key_prefix)
