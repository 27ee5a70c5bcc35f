"""The projector workflow: `projector/{name}`, the durable home of one async projector.

It only runs the projector's long-running activity, an hour at a time, again and again (retried
forever, on another worker when one dies) and continues as new when Temporal suggests it, so the
projector always has one runner the operator can find in the Web UI. Its status is in the read model
(`GET /v1/projectors`), where the activity records it.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from durable_outbox_temporal.contract.projector import WORKFLOW_TYPE, ProjectorInput

    from activities.projectors import ProjectorActivities

# No attempt limit: a runner that fails (its worker stopped, the database was unreachable) is
# always run again; the projector's own failures are counted in the read model, not here.
_RUNNER_RETRIES = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=60)
)


@workflow.defn(name=WORKFLOW_TYPE)
class ProjectorWorkflow:
    """Keeps one runner of the projector going; ends only when terminated."""

    @workflow.run
    async def run(self, start: ProjectorInput) -> None:
        workflow.set_current_details(
            f"Projector **{start.name}**: its status is at `GET /v1/projectors/{start.name}`."
        )
        while not workflow.info().is_continue_as_new_suggested():
            await workflow.execute_activity_method(
                ProjectorActivities.run_projector,
                start.name,
                task_queue=start.operations_task_queue,
                start_to_close_timeout=timedelta(hours=2),
                heartbeat_timeout=timedelta(seconds=30),
                retry_policy=_RUNNER_RETRIES,
                summary=f"project {start.name}",
            )
        workflow.continue_as_new(start)
