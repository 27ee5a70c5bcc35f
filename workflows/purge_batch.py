"""A purge batch: cancel, page by page, every item of an outbox not yet submitted.

The shape of a redrive batch (`workflows/redrive_batch.py`, whose `run_page` it shares): each
page is one activity on the operations worker, which empties the lanes (first page) and cancels
the next page of queued items in key order; the progress is in the history, so an API restart
does not touch it, and a retried page finds what it cancelled no longer queued.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from durable_outbox_temporal.contract.dead_letters import PROGRESS_QUERY
    from durable_outbox_temporal.contract.purge import (
        MAX_REPORTED_KEYS,
        PURGE_BATCH_WORKFLOW_TYPE,
        PurgeBatchInput,
        PurgeBatchProgress,
        PurgePageRequest,
    )

    from activities.purge import PurgeActivities
    from workflows.redrive_batch import PAGES_PER_RUN, run_page


@workflow.defn(name=PURGE_BATCH_WORKFLOW_TYPE)
class PurgeBatchWorkflow:
    @workflow.init
    def __init__(self, batch: PurgeBatchInput) -> None:
        self._progress = batch.progress

    @workflow.query(name=PROGRESS_QUERY)
    def progress(self) -> PurgeBatchProgress:
        return self._progress

    def _failed(self, reason: str) -> None:
        self._progress.failure = reason

    @workflow.run
    async def run(self, batch: PurgeBatchInput) -> PurgeBatchProgress:
        progress = self._progress
        for _ in range(PAGES_PER_RUN):
            page = await run_page(
                PurgeActivities.purge_page,
                PurgePageRequest(
                    outbox=progress.outbox,
                    destination=progress.destination,
                    reason=progress.reason,
                    cursor=progress.cursor,
                ),
                task_queue=batch.operations_task_queue,
                summary=f"page {progress.pages + 1}",
                record_failure=self._failed,
            )
            progress.cancelled += len(page.cancelled)
            progress.skipped += page.skipped
            progress.pages += 1
            progress.cursor = page.next_cursor
            room = MAX_REPORTED_KEYS - len(progress.keys)
            progress.keys.extend(page.cancelled[: max(room, 0)])
            workflow.set_current_details(
                f"{progress.cancelled} cancelled, {progress.skipped} skipped,"
                f" {progress.pages} page(s)"
            )
            if page.next_cursor is None:
                progress.done = True
                progress.finished_at = workflow.now()
                return progress
            if workflow.info().is_continue_as_new_suggested():
                break
        workflow.continue_as_new(PurgeBatchInput(batch.operations_task_queue, progress))
