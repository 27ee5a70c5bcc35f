"""The retention schedule: a Temporal Schedule, created (or brought up to date) by each worker
that runs workflows, that starts a `Retention` run every interval (`workflows/retention.py`).

A Schedule rather than a timer loop in the worker: its runs are visible in the Web UI (paused,
triggered, their history), one run at a time whatever the number of workers (overlap: skip),
and a worker down at a fire time misses nothing the next run does not catch up.
"""

from __future__ import annotations

from datetime import timedelta

from durable_outbox_temporal.client import RPC_TIMEOUT
from durable_outbox_temporal.contract.retention import (
    RETENTION_WORKFLOW_TYPE,
    RetentionInput,
    retention_schedule_id,
    retention_workflow_id,
)
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
)


def retention_schedule(
    workflow_task_queue: str, operations_task_queue: str, every: timedelta
) -> Schedule:
    """The schedule's definition: a run every `every`, never two at once."""
    return Schedule(
        action=ScheduleActionStartWorkflow(
            RETENTION_WORKFLOW_TYPE,
            RetentionInput(operations_task_queue),
            id=retention_workflow_id(workflow_task_queue),
            task_queue=workflow_task_queue,
            static_summary="Prune ended items' payloads and rows past their retention",
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=every)]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
    )


async def ensure_retention_schedule(
    client: Client, workflow_task_queue: str, operations_task_queue: str, every: timedelta
) -> str:
    """Create the retention schedule, or update its action and interval to this worker's (a
    pause an operator set stays); its id."""
    schedule_id = retention_schedule_id(workflow_task_queue)
    schedule = retention_schedule(workflow_task_queue, operations_task_queue, every)
    try:
        await client.create_schedule(schedule_id, schedule, rpc_timeout=RPC_TIMEOUT)
    except ScheduleAlreadyRunningError:

        def keep_state(update: ScheduleUpdateInput) -> ScheduleUpdate:
            schedule.state = update.description.schedule.state
            return ScheduleUpdate(schedule=schedule)

        await client.get_schedule_handle(schedule_id).update(keep_state, rpc_timeout=RPC_TIMEOUT)
    return schedule_id
