"""A reseal batch: every sealed value of the read model sealed again under the newest payload
key, page by page, so an older key can be removed (`readmodel/reseal.py`).

The shape of a redrive batch (`workflows/redrive_batch.py`, whose `run_page` it shares): each
page is one activity on the operations worker, so the progress is in the history; a retried
page finds the values it resealed under the current key already and leaves them.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from durable_outbox_temporal.contract.dead_letters import PROGRESS_QUERY
    from durable_outbox_temporal.contract.reseal import (
        MAX_REPORTED_UNREADABLE,
        RESEAL_BATCH_WORKFLOW_TYPE,
        ResealBatchInput,
        ResealBatchProgress,
        ResealPageRequest,
    )

    from activities.reseal import ResealActivities
    from workflows.redrive_batch import PAGES_PER_RUN, run_page


@workflow.defn(name=RESEAL_BATCH_WORKFLOW_TYPE)
class ResealBatchWorkflow:
    @workflow.init
    def __init__(self, batch: ResealBatchInput) -> None:
        self._progress = batch.progress

    @workflow.query(name=PROGRESS_QUERY)
    def progress(self) -> ResealBatchProgress:
        return self._progress

    def _failed(self, reason: str) -> None:
        self._progress.failure = reason

    @workflow.run
    async def run(self, batch: ResealBatchInput) -> ResealBatchProgress:
        progress = self._progress
        for _ in range(PAGES_PER_RUN):
            page = await run_page(
                ResealActivities.reseal_page,
                ResealPageRequest(table=progress.table, cursor=progress.cursor),
                task_queue=batch.operations_task_queue,
                summary=f"page {progress.pages + 1}",
                record_failure=self._failed,
            )
            progress.key_id = page.key_id
            progress.resealed += page.resealed
            progress.unreadable += len(page.unreadable)
            progress.pages += 1
            room = MAX_REPORTED_UNREADABLE - len(progress.errors)
            progress.errors.extend(page.unreadable[: max(room, 0)])
            if page.next_table != page.table:
                progress.tables_done.append(page.table)
            progress.table, progress.cursor = page.next_table, page.next_cursor
            workflow.set_current_details(
                f"{progress.resealed} resealed under {page.key_id}, {progress.unreadable}"
                f" unreadable, {progress.pages} page(s), in {page.table}"
            )
            if page.next_table is None:
                progress.done = True
                progress.finished_at = workflow.now()
                return progress
            if workflow.info().is_continue_as_new_suggested():
                break
        workflow.continue_as_new(ResealBatchInput(batch.operations_task_queue, progress))
