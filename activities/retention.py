"""Retention, the worker's side of it: the schedule that starts a `Retention` run
(`workflows/retention.py`) every interval, created (or brought up to date) by each worker that
runs workflows, and the operations worker's activities a run calls: the rules from the worker's
destinations, and one page of pruning at a time (`readmodel.retention`): items' payloads,
their rows, and idle lanes' rows.

A Schedule rather than a timer loop in the worker: its runs are visible in the Web UI (paused,
triggered, their history), one run at a time whatever the number of workers (overlap: skip),
and a worker down at a fire time misses nothing the next run does not catch up.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from durable_outbox_temporal.client import RPC_TIMEOUT
from durable_outbox_temporal.contract.retention import (
    PRUNE_LANES_PAGE_ACTIVITY,
    PRUNE_PAGE_ACTIVITY,
    RETENTION_PLAN_ACTIVITY,
    RETENTION_WORKFLOW_TYPE,
    PruneLanesRequest,
    PrunePageRequest,
    PrunePageResult,
    RetentionInput,
    RetentionPlan,
    RetentionPlanRequest,
    RetentionRule,
    retention_schedule_id,
    retention_workflow_id,
)
from durable_outbox_temporal.destinations import DEFAULT_ITEM_RETENTION_S, DestinationRegistry
from sqlalchemy import Engine
from temporalio import activity
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

from readmodel.permits import sweep_stale_counts
from readmodel.retention import prune_idle_lanes, prune_payloads, prune_rows

# Flow-control counts one retention run sweeps at most (in one transaction; hourly runs).
FLOW_SWEEP_LIMIT = 10_000


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


class RetentionActivities:
    """Plans and prunes over the read model, by the retention `registry` configures."""

    def __init__(self, engine: Engine, registry: DestinationRegistry) -> None:
        self.engine = engine
        self.registry = registry

    @activity.defn(name=RETENTION_PLAN_ACTIVITY)
    async def retention_plan(self, _: RetentionPlanRequest) -> RetentionPlan:
        """One rule per destination for the outboxes without overrides, then one per outbox
        with an override and destination. It also sweeps flow control's counts past the longest
        quota window (up to `FLOW_SWEEP_LIMIT` a run): a scope never used again keeps its own."""
        swept = await asyncio.to_thread(
            sweep_stale_counts, self.engine, datetime.now(UTC), FLOW_SWEEP_LIMIT
        )
        overridden = self.registry.overridden_outboxes()
        rules = []
        for outbox in [None, *overridden]:
            for destination in self.registry:
                payload_s, item_s = self.registry.retention(outbox, destination)
                rules.append(
                    RetentionRule(
                        destination=destination.name,
                        outbox=outbox,
                        payload_retention_s=payload_s,
                        item_retention_s=item_s,
                        excluded=overridden if outbox is None else [],
                    )
                )
        # A lane may carry items of any destination: its row outlives the longest item row.
        lanes_s = max((rule.item_retention_s for rule in rules), default=DEFAULT_ITEM_RETENTION_S)
        return RetentionPlan(rules, lane_retention_s=lanes_s, flow_counts_swept=swept)

    @activity.defn(name=PRUNE_PAGE_ACTIVITY)
    async def prune_page(self, request: PrunePageRequest) -> PrunePageResult:
        """One page of the rule's phase: payloads, or rows."""
        prune = prune_payloads if request.phase == "payloads" else prune_rows
        return await asyncio.to_thread(
            prune,
            self.engine,
            request.rule,
            request.ended_before,
            request.limit,
            after=request.after,
        )

    @activity.defn(name=PRUNE_LANES_PAGE_ACTIVITY)
    async def prune_lanes_page(self, request: PruneLanesRequest) -> PrunePageResult:
        """One page of idle lanes' rows (the last also takes routes left with no owner's row)."""
        return await asyncio.to_thread(
            prune_idle_lanes, self.engine, request.idle_before, request.limit, request.after
        )
