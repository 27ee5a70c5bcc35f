"""One fire of a scheduled fan-out: enqueue the schedule's templated batch, once.

A Temporal Schedule starts this workflow at each fire time with the id
`scheduled-batch/{schedule}-{fire time}` and stamps the fire time on it
(`TemporalScheduledStartTime`). The workflow hands the batch and that fire time to the operations
worker, which enqueues each item under a key derived from them: a retried activity, or a second
run for the same fire time, finds the items already there instead of adding more.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from durable_outbox_temporal.contract.schedule import (
        BATCH_INCOMPLETE_ERROR,
        NOT_SCHEDULED_ERROR,
        SCHEDULED_BATCH_WORKFLOW_TYPE,
        SCHEDULED_START_TIME,
        FireRequest,
        FireResult,
        ScheduledBatchInput,
    )

    from activities.schedules import ScheduleActivities
    from workflows.redrive_batch import run_page

# Temporal being briefly unreachable or an ordering lane being full are worth retrying for a
# while (a batch's bounded retries, `run_page`); a fire that cannot enqueue by then, or within
# the hour, fails with the reason (red in the Web UI) and the next one goes on.
_ENQUEUE_DEADLINE = timedelta(hours=1)
_ENQUEUE_ATTEMPT = timedelta(minutes=2)


@workflow.defn(name=SCHEDULED_BATCH_WORKFLOW_TYPE)
class ScheduledBatchWorkflow:
    """Enqueues one fire's batch through the operations worker; fails if any item was refused."""

    @workflow.run
    async def run(self, batch: ScheduledBatchInput) -> FireResult:
        scheduled_at = workflow.info().typed_search_attributes.get(SCHEDULED_START_TIME)
        if scheduled_at is None:
            # Without the fire time there is no key that makes a re-run harmless.
            raise ApplicationError(
                "ScheduledBatch runs only from a schedule: no TemporalScheduledStartTime",
                type=NOT_SCHEDULED_ERROR,
                non_retryable=True,
            )
        result = await run_page(
            ScheduleActivities.enqueue_batch,
            FireRequest(batch=batch, scheduled_at=scheduled_at),
            task_queue=batch.operations_task_queue,
            summary=f"enqueue {len(batch.items)} item(s) into {batch.outbox}",
            attempt_timeout=_ENQUEUE_ATTEMPT,
            deadline=_ENQUEUE_DEADLINE,
        )
        if result.failed:
            first = result.failed[0]
            raise ApplicationError(
                f"{len(result.failed)} of {len(batch.items)} item(s) refused;"
                f" first: {first.key}: {first.message}",
                result,
                type=BATCH_INCOMPLETE_ERROR,
                non_retryable=True,
            )
        return result
