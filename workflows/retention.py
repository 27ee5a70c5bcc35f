"""A retention run: ended items' payloads, then their rows, pruned rule by rule, page by page
(`readmodel/retention.py`); started by the retention schedule
(`activities/retention.py`).

The shape of a redrive batch (`workflows/redrive_batch.py`, whose `run_page` it shares): each
page is one activity on the operations worker, so the progress is in the history and a worker
crash retries only the page in flight. The cutoff is fixed at the run's start: a page of items
that ended before it, retried, finds the ones it pruned gone and takes the next.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from durable_outbox_temporal.contract.dead_letters import PROGRESS_QUERY
    from durable_outbox_temporal.contract.retention import (
        RETENTION_WORKFLOW_TYPE,
        PrunePageRequest,
        RetentionInput,
        RetentionPlanRequest,
        RetentionProgress,
    )

    from activities.retention import RetentionActivities
    from workflows.redrive_batch import PAGES_PER_RUN, run_page


@workflow.defn(name=RETENTION_WORKFLOW_TYPE)
class RetentionWorkflow:
    @workflow.init
    def __init__(self, run: RetentionInput) -> None:
        self._progress = run.progress

    @workflow.query(name=PROGRESS_QUERY)
    def progress(self) -> RetentionProgress:
        return self._progress

    def _failed(self, reason: str) -> None:
        self._progress.failure = reason

    @workflow.run
    async def run(self, run: RetentionInput) -> RetentionProgress:
        progress = self._progress
        if progress.rules is None:
            progress.started_at = workflow.now()
            plan = await run_page(
                RetentionActivities.retention_plan,
                RetentionPlanRequest(),
                task_queue=run.operations_task_queue,
                summary="plan",
                record_failure=self._failed,
            )
            progress.rules = plan.rules
        assert progress.started_at is not None
        for _ in range(PAGES_PER_RUN):
            if progress.rule >= len(progress.rules):
                progress.done = True
                progress.finished_at = workflow.now()
                return progress
            rule = progress.rules[progress.rule]
            kept_s = (
                rule.payload_retention_s if progress.phase == "payloads" else rule.item_retention_s
            )
            page = await run_page(
                RetentionActivities.prune_page,
                PrunePageRequest(
                    rule=rule,
                    phase=progress.phase,
                    ended_before=progress.started_at - timedelta(seconds=kept_s),
                    after=progress.after,
                ),
                task_queue=run.operations_task_queue,
                summary=f"{progress.phase} of {rule.destination}"
                + (f" in {rule.outbox}" if rule.outbox else ""),
                record_failure=self._failed,
            )
            progress.pages += 1
            if progress.phase == "payloads":
                progress.payloads_pruned += page.pruned
            else:
                progress.rows_pruned += page.pruned
            # The next page goes on after this one's last item (an older activity's result has
            # none: its pages start from the oldest, as they always did).
            progress.after = page.last
            if not page.more:
                progress.after = None
                if progress.phase == "payloads":
                    progress.phase = "rows"
                else:
                    progress.rule, progress.phase = progress.rule + 1, "payloads"
            workflow.set_current_details(
                f"{progress.payloads_pruned} payloads and {progress.rows_pruned} rows pruned,"
                f" {progress.pages} page(s), rule {progress.rule + 1} of {len(progress.rules)}"
            )
            if workflow.info().is_continue_as_new_suggested():
                break
        workflow.continue_as_new(RetentionInput(run.operations_task_queue, progress))
