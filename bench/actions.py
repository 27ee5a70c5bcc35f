"""Temporal Cloud billable actions per workflow, counted from its event history.

The rule, after Temporal Cloud's list of actions (docs.temporal.io/cloud/actions), for what an
event history shows:

| History event | Actions |
|---|---|
| `WorkflowExecutionStarted` (a client's start, a continue-as-new's next run) | 1 |
| `StartChildWorkflowExecutionInitiated` (the child's start) | 1 |
| `ActivityTaskScheduled` | 1 per attempt: its started event's attempt number (1 if none) |
| `MarkerRecorded` of a local activity | 1 |
| `TimerStarted` | 1 |
| `WorkflowExecutionSignaled`, `SignalExternalWorkflowExecutionInitiated` | 1 |
| `WorkflowExecutionUpdateAccepted` | 1 |
| `UpsertWorkflowSearchAttributes`, `WorkflowPropertiesModified` | 1 |

Not in a history, so not counted: queries, activity heartbeats, rejected updates. Workflow
tasks are not actions.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

_ONE_EACH = frozenset(
    {
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED,
        EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED,
        EventType.EVENT_TYPE_TIMER_STARTED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
        EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED,
        EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
        EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED,
    }
)
LOCAL_ACTIVITY_MARKER = "core_local_activity"


def billable_actions(events: Iterable[HistoryEvent]) -> int:
    """The actions one run's history records, by the rule above."""
    actions = 0
    # Scheduled activity -> attempts, corrected by the started event's attempt number.
    attempts: dict[int, int] = {}
    for event in events:
        kind = event.event_type
        if kind in _ONE_EACH:
            actions += 1
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attempts[event.event_id] = 1
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started = event.activity_task_started_event_attributes
            attempts[started.scheduled_event_id] = max(1, started.attempt)
        elif (
            kind == EventType.EVENT_TYPE_MARKER_RECORDED
            and event.marker_recorded_event_attributes.marker_name == LOCAL_ACTIVITY_MARKER
        ):
            actions += 1
    return actions + sum(attempts.values())


async def actions_per_workflow(client: Client, workflow_ids: list[str]) -> float:
    """The mean over `workflow_ids` (each one's latest run) of its billable actions."""
    counts = []
    for workflow_id in workflow_ids:
        handle = client.get_workflow_handle(workflow_id)
        counts.append(billable_actions([e async for e in handle.fetch_history_events()]))
    return round(statistics.mean(counts), 2) if counts else float("nan")


async def run_histories(client: Client, workflow_id: str) -> list[list[HistoryEvent]]:
    """The events of every run of a workflow, the latest first, back through each hand-over
    (continue-as-new) to the first run."""
    runs: list[list[HistoryEvent]] = []
    run_id: str | None = None
    while True:
        handle = client.get_workflow_handle(workflow_id, run_id=run_id)
        events = [event async for event in handle.fetch_history_events()]
        runs.append(events)
        run_id = events[0].workflow_execution_started_event_attributes.continued_execution_run_id
        if not run_id:
            return runs
