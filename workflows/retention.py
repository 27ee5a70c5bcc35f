"""A retention run: ended items' payloads, then their rows, pruned rule by rule, page by page,
then the rows of lanes idle past the longest item retention (`readmodel/retention.py`); started
by the retention schedule (`activities/retention.py`).

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
        PruneLanesRequest,
        PrunePageRequest,
        RetentionInput,
        RetentionPlanRequest,
        RetentionProgress,
        RetentionRule,
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
            progress.lane_retention_s = plan.lane_retention_s
            progress.flow_counts_swept = plan.flow_counts_swept
        assert progress.started_at is not None
        for _ in range(PAGES_PER_RUN):
            if progress.rule < len(progress.rules):
                await self._prune_page(run, progress, progress.rules[progress.rule])
            # No patch: a run planned before lanes were pruned has no `lane_retention_s` (its
            # recorded plan says so) and replays without this phase.
            elif progress.lane_retention_s is not None and not progress.lanes_done:
                await self._prune_lanes_page(run, progress, progress.lane_retention_s)
            else:
                progress.done = True
                progress.finished_at = workflow.now()
                return progress
            workflow.set_current_details(
                f"{progress.payloads_pruned} payloads, {progress.rows_pruned} rows and"
                f" {progress.lanes_pruned} idle lanes pruned, {progress.pages} page(s),"
                f" rule {min(progress.rule + 1, len(progress.rules))} of {len(progress.rules)}"
            )
            if workflow.info().is_continue_as_new_suggested():
                break
        workflow.continue_as_new(RetentionInput(run.operations_task_queue, progress))

    async def _prune_page(
        self, run: RetentionInput, progress: RetentionProgress, rule: RetentionRule
    ) -> None:
        """One page of the rule's phase; the next phase, or rule, once it has nothing left."""
        assert progress.started_at is not None
        kept_s = rule.payload_retention_s if progress.phase == "payloads" else rule.item_retention_s
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

    async def _prune_lanes_page(
        self, run: RetentionInput, progress: RetentionProgress, kept_s: float
    ) -> None:
        """One page of the rows of lanes idle for longer than `kept_s`."""
        assert progress.started_at is not None
        page = await run_page(
            RetentionActivities.prune_lanes_page,
            PruneLanesRequest(
                idle_before=progress.started_at - timedelta(seconds=kept_s),
                after=progress.lanes_after,
            ),
            task_queue=run.operations_task_queue,
            summary="idle lanes",
            record_failure=self._failed,
        )
        progress.pages += 1
        progress.lanes_pruned += page.pruned
        progress.lanes_after = page.last
        progress.lanes_done = not page.more
