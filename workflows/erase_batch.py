"""An erase batch: erase, page by page, every ended item of an outbox a filter selects (a key
prefix, or a subject's digest).

The shape of a purge batch (`workflows/purge_batch.py`) and `run_page` from the redrive batch:
each page is one activity on the operations worker, which erases the next page of items in key
order; the progress is in the history, so an API restart does not touch it, and a page retried
after a crash finds what it erased already erased (erasing is idempotent).
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from durable_outbox_temporal.contract.dead_letters import PROGRESS_QUERY
    from durable_outbox_temporal.contract.erasure import (
        ERASE_BATCH_WORKFLOW_TYPE,
        MAX_REPORTED_SKIPS,
        EraseBatchInput,
        EraseBatchProgress,
        ErasePageRequest,
    )

    from activities.erasure import EraseActivities
    from workflows.redrive_batch import PAGES_PER_RUN, run_page


@workflow.defn(name=ERASE_BATCH_WORKFLOW_TYPE)
class EraseBatchWorkflow:
    @workflow.init
    def __init__(self, batch: EraseBatchInput) -> None:
        self._progress = batch.progress

    @workflow.query(name=PROGRESS_QUERY)
    def progress(self) -> EraseBatchProgress:
        return self._progress

    def _failed(self, reason: str) -> None:
        self._progress.failure = reason

    @workflow.run
    async def run(self, batch: EraseBatchInput) -> EraseBatchProgress:
        progress = self._progress
        for _ in range(PAGES_PER_RUN):
            page = await run_page(
                EraseActivities.erase_page,
                ErasePageRequest(
                    outbox=progress.outbox,
                    key_prefix=progress.key_prefix,
                    subject_digest=progress.subject_digest,
                    cursor=progress.cursor,
                ),
                task_queue=batch.operations_task_queue,
                summary=f"page {progress.pages + 1}",
                record_failure=self._failed,
            )
            progress.erased += page.erased
            progress.skipped += len(page.skipped)
            progress.pages += 1
            progress.cursor = page.next_cursor
            room = MAX_REPORTED_SKIPS - len(progress.skips)
            progress.skips.extend(page.skipped[: max(room, 0)])
            workflow.set_current_details(
                f"{progress.erased} erased, {progress.skipped} skipped, {progress.pages} page(s)"
            )
            if page.next_cursor is None:
                progress.done = True
                progress.finished_at = workflow.now()
                return progress
            if workflow.info().is_continue_as_new_suggested():
                break
        workflow.continue_as_new(EraseBatchInput(batch.operations_task_queue, progress))
