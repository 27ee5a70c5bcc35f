"""Scheduled fan-out's activity, on the operations worker: enqueue the templated batch of one
fire (`workflows/scheduled_batch.py`).

Enqueueing goes through `OutboxClient.enqueue`, which keeps every item rule (validation,
idempotency, ordering lanes); the schedules themselves are the service's (`service/schedules.py`).
"""

from __future__ import annotations

import functools
from datetime import datetime

from durable_outbox_temporal import (
    IdempotencyConflict,
    InvalidRequest,
    ItemFailedUseRedrive,
    OutboxClient,
    UnknownDestination,
)
from durable_outbox_temporal.contract.schedule import (
    ENQUEUE_SCHEDULED_BATCH_ACTIVITY,
    FailedItem,
    FireRequest,
    FireResult,
    ItemTemplate,
    ScheduledBatchInput,
    fire_values,
    item_key,
    render,
)
from durable_outbox_temporal.fan_out import fan_out
from temporalio import activity

# Item errors no retry of the fire can fix: the fire reports them and goes on with the rest.
_PERMANENT = (InvalidRequest, UnknownDestination, IdempotencyConflict)


class ScheduleActivities:
    """The operations worker's activity that enqueues one fire's batch, over an injected
    `OutboxClient` (the worker's destinations and workflow task queue)."""

    def __init__(self, client: OutboxClient) -> None:
        self.client = client

    @activity.defn(name=ENQUEUE_SCHEDULED_BATCH_ACTIVITY)
    async def enqueue_batch(self, request: FireRequest) -> FireResult:
        """Enqueue every item of the fire under its fire-derived key, so a retry (or a second
        run for the same fire time) finds the items it already made instead of adding more.

        An item refused for good (its destination was since removed from the configuration,
        its key reused with another request) is reported in the result; anything else that
        fails (Temporal unavailable, a full ordering lane) fails the attempt, to be retried.
        """
        batch = request.batch
        keys = [
            item_key(batch.schedule_id, request.scheduled_at, item.suffix(index))
            for index, item in enumerate(batch.items)
        ]
        outcomes = await fan_out(
            [
                functools.partial(self._enqueue, batch, request.scheduled_at, item, key)
                for item, key in zip(batch.items, keys, strict=True)
            ]
        )
        result = FireResult(
            schedule_id=batch.schedule_id,
            scheduled_at=request.scheduled_at,
            created=0,
            existing=0,
            keys=keys,
        )
        for index, (key, outcome) in enumerate(zip(keys, outcomes, strict=True)):
            if isinstance(outcome, ItemFailedUseRedrive):
                result.existing += 1  # an earlier try made it, and it has failed since
            elif isinstance(outcome, _PERMANENT):
                result.failed.append(FailedItem(index, key, type(outcome).__name__, str(outcome)))
            elif isinstance(outcome, Exception):
                raise outcome
            elif outcome:
                result.created += 1
            else:
                result.existing += 1
        activity.logger.info(
            "schedule %s fire %s: %d created, %d existing, %d refused",
            batch.schedule_id,
            request.scheduled_at.isoformat(),
            result.created,
            result.existing,
            len(result.failed),
        )
        return result

    async def _enqueue(
        self, batch: ScheduledBatchInput, scheduled_at: datetime, item: ItemTemplate, key: str
    ) -> bool:
        values = fire_values(batch.schedule_id, scheduled_at, batch.timezone, key)
        enqueued = await self.client.enqueue(
            batch.outbox,
            item.destination,
            render(item.payload, values),
            key=key,
            ordering_key=item.ordering_key,
            max_attempts=item.max_attempts,
        )
        return enqueued.created
