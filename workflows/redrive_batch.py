"""A dead-letter redrive batch: redrive, page by page, every dead letter a filter selects.

Each page is one activity on the operations worker (it reads the read model and redrives
through the client), so the batch's progress is in its history: an API restart does not touch
it, and a worker crash retries only the page in flight, whose already-redriven items are no
longer failed and are skipped. It selects items that failed before it was asked for, so the
ones it redrives and that fail again are not taken twice.

`run_page` is how every paged batch (this one, `PurgeBatch`) runs a page: bounded retries, then
the batch ends failed with the reason in its progress, never retrying for ever.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from durable_outbox_temporal.contract.dead_letters import (
        PROGRESS_QUERY,
        REDRIVE_BATCH_WORKFLOW_TYPE,
        RedriveBatchInput,
        RedriveBatchProgress,
        RedrivePageRequest,
    )

    from activities.redrive import RedriveActivities

# Keys a batch names in its progress as not redriven (with why); the counts cover the rest.
MAX_REPORTED_ERRORS = 20
# Temporal or the read model briefly unreachable: retried with backoff for a few minutes. A page
# that still fails (a filter the read model cannot run, say) will not pass by retrying more: the
# batch ends failed, with the reason, rather than running for ever.
PAGE_RETRIES = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=60),
    maximum_attempts=10,
)
PAGE_ATTEMPT = timedelta(minutes=5)
# The error type a batch fails with when a page ran out of retries.
BATCH_FAILED_ERROR = "BatchFailed"
# Continue as new well before the history grows large: each page adds a handful of events.
PAGES_PER_RUN = 500

Activities = TypeVar("Activities")
Request = TypeVar("Request")
Result = TypeVar("Result")


async def run_page(
    activity: Callable[[Activities, Request], Awaitable[Result]],
    request: Request,
    *,
    task_queue: str,
    summary: str,
    record_failure: Callable[[str], None] | None = None,
    attempt_timeout: timedelta = PAGE_ATTEMPT,
    deadline: timedelta | None = None,
) -> Result:
    """Run one page of a batch (up to `deadline` in all, if given); when its retries run out,
    record why (in the progress the API shows) and fail the batch with that reason."""
    try:
        return await workflow.execute_activity_method(
            activity,
            request,
            task_queue=task_queue,
            start_to_close_timeout=attempt_timeout,
            schedule_to_close_timeout=deadline,
            retry_policy=PAGE_RETRIES,
            summary=summary,
        )
    except ActivityError as err:
        reason = f"{summary} failed after its retries: {_reason(err)}"
        if record_failure is not None:
            record_failure(reason)
        workflow.set_current_details(reason)
        raise ApplicationError(reason, type=BATCH_FAILED_ERROR, non_retryable=True) from None


# How much of the last failure's message the reason keeps: its first line (a database error
# goes on with the whole statement).
_REASON_CHARS = 500


def _reason(err: ActivityError) -> str:
    cause = err.cause
    text = str(cause or err)
    if isinstance(cause, ApplicationError) and cause.type:
        text = f"{cause.type}: {cause.message}"
    return text.strip().split("\n", 1)[0][:_REASON_CHARS]


@workflow.defn(name=REDRIVE_BATCH_WORKFLOW_TYPE)
class RedriveBatchWorkflow:
    @workflow.init
    def __init__(self, batch: RedriveBatchInput) -> None:
        self._progress = batch.progress

    @workflow.query(name=PROGRESS_QUERY)
    def progress(self) -> RedriveBatchProgress:
        return self._progress

    @workflow.run
    async def run(self, batch: RedriveBatchInput) -> RedriveBatchProgress:
        progress = self._progress
        if progress.failed_before is None:
            progress.failed_before = workflow.now()
        for _ in range(PAGES_PER_RUN):
            page = await run_page(
                RedriveActivities.redrive_page,
                RedrivePageRequest(
                    outbox=progress.outbox,
                    filter=progress.filter,
                    failed_before=progress.failed_before,
                    cursor=progress.cursor,
                ),
                task_queue=batch.operations_task_queue,
                summary=f"page {progress.pages + 1}",
                # The progress has no field of its own for it: the reason leads its errors.
                record_failure=lambda reason: progress.errors.insert(0, reason),
            )
            progress.redriven += len(page.redriven)
            progress.skipped += page.skipped
            progress.pages += 1
            progress.cursor = page.next_cursor
            room = MAX_REPORTED_ERRORS - len(progress.errors)
            progress.errors.extend(page.errors[: max(room, 0)])
            workflow.set_current_details(
                f"{progress.redriven} redriven, {progress.skipped} skipped,"
                f" {progress.pages} page(s)"
            )
            if page.next_cursor is None:
                progress.done = True
                progress.finished_at = workflow.now()
                return progress
            if workflow.info().is_continue_as_new_suggested():
                break
        workflow.continue_as_new(RedriveBatchInput(batch.operations_task_queue, progress))
