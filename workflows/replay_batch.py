"""A replay batch: enqueue again, page by page, every item a filter selects, to a target.

The shape of a redrive batch (`workflows/redrive_batch.py`, whose `run_page` it shares): each
page is one activity on the operations worker; the progress is in the history, so an API
restart does not touch it, and a retried page finds the keys it enqueued taken. It selects items
created before it began, so the ones it enqueues are never selected again.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from durable_outbox_temporal.contract.dead_letters import PROGRESS_QUERY
    from durable_outbox_temporal.contract.replay import (
        REPLAY_BATCH_WORKFLOW_TYPE,
        ReplayBatchInput,
        ReplayBatchProgress,
        ReplayPageRequest,
    )

    from activities.replay import ReplayActivities
    from workflows.redrive_batch import MAX_REPORTED_ERRORS, PAGES_PER_RUN, run_page


@workflow.defn(name=REPLAY_BATCH_WORKFLOW_TYPE)
class ReplayBatchWorkflow:
    @workflow.init
    def __init__(self, batch: ReplayBatchInput) -> None:
        self._progress = batch.progress

    @workflow.query(name=PROGRESS_QUERY)
    def progress(self) -> ReplayBatchProgress:
        return self._progress

    def _failed(self, reason: str) -> None:
        self._progress.failure = reason

    @workflow.run
    async def run(self, batch: ReplayBatchInput) -> ReplayBatchProgress:
        progress = self._progress
        if progress.created_before is None:
            progress.created_before = workflow.now()
        for _ in range(PAGES_PER_RUN):
            page = await run_page(
                ReplayActivities.replay_page,
                ReplayPageRequest(
                    outbox=progress.outbox,
                    replay_id=batch.replay_id,
                    filter=progress.filter,
                    target=progress.target,
                    created_before=progress.created_before,
                    cursor=progress.cursor,
                ),
                task_queue=batch.operations_task_queue,
                summary=f"page {progress.pages + 1}",
                record_failure=self._failed,
            )
            progress.replayed += page.replayed
            progress.already += page.already
            progress.erased += page.erased
            progress.pruned += page.pruned
            progress.pages += 1
            progress.cursor = page.next_cursor
            room = MAX_REPORTED_ERRORS - len(progress.errors)
            progress.errors.extend(page.errors[: max(room, 0)])
            workflow.set_current_details(
                f"{progress.replayed} replayed, {progress.already} already,"
                f" {progress.erased + progress.pruned} without payload, {progress.pages} page(s)"
            )
            if page.next_cursor is None:
                progress.done = True
                progress.finished_at = workflow.now()
                return progress
            if workflow.info().is_continue_as_new_suggested():
                break
        workflow.continue_as_new(
            ReplayBatchInput(batch.operations_task_queue, batch.replay_id, progress)
        )
