"""A dead-letter redrive batch: redrive, page by page, every dead letter a filter selects.

Each page is one activity on the operations worker (it reads the read model and redrives
through the client), so the batch's progress is in its history: an API restart does not touch
it, and a worker crash retries only the page in flight, whose already-redriven items are no
longer failed and are skipped. It selects items that failed before it was asked for, so the
ones it redrives and that fail again are not taken twice.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from contract.dead_letters import (
        PROGRESS_QUERY,
        REDRIVE_BATCH_WORKFLOW_TYPE,
        RedriveBatchInput,
        RedriveBatchProgress,
        RedrivePageRequest,
    )
    from service.dead_letters import MAX_REPORTED_ERRORS, DeadLetterActivities

# Temporal or the read model briefly unreachable: retried with backoff, for as long as it takes
# (an operator terminates a batch that should stop).
_PAGE_RETRIES = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=60)
)
# Continue as new well before the history grows large: each page adds a handful of events.
_PAGES_PER_RUN = 500


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
        for _ in range(_PAGES_PER_RUN):
            page = await workflow.execute_activity_method(
                DeadLetterActivities.redrive_page,
                RedrivePageRequest(
                    outbox=progress.outbox,
                    filter=progress.filter,
                    failed_before=progress.failed_before,
                    cursor=progress.cursor,
                ),
                task_queue=batch.operations_task_queue,
                start_to_close_timeout=timedelta(minutes=5),
                retry_policy=_PAGE_RETRIES,
                summary=f"page {progress.pages + 1}",
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
