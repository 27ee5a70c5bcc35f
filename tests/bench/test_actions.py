"""The billable-action count of a history, by the rule in bench/actions.py."""

from __future__ import annotations

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import (
    ActivityTaskStartedEventAttributes,
    HistoryEvent,
    MarkerRecordedEventAttributes,
)

from bench.actions import billable_actions


def event(event_id: int, kind: EventType.ValueType, **attributes: object) -> HistoryEvent:
    return HistoryEvent(event_id=event_id, event_type=kind, **attributes)  # type: ignore[arg-type]


def test_each_action_kind_counts_and_activity_retries_count_per_attempt() -> None:
    history = [
        event(1, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED),
        event(2, EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED),  # not an action
        event(
            5,
            EventType.EVENT_TYPE_MARKER_RECORDED,
            marker_recorded_event_attributes=MarkerRecordedEventAttributes(
                marker_name="core_local_activity"
            ),
        ),
        event(
            6,
            EventType.EVENT_TYPE_MARKER_RECORDED,
            marker_recorded_event_attributes=MarkerRecordedEventAttributes(marker_name="patch"),
        ),
        event(7, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED),
        event(
            8,
            EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED,
            activity_task_started_event_attributes=ActivityTaskStartedEventAttributes(
                scheduled_event_id=7, attempt=3
            ),
        ),
        event(9, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED),  # never started: one action
        event(10, EventType.EVENT_TYPE_TIMER_STARTED),
        event(11, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED),
        event(12, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED),
        event(13, EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES),
        event(14, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED),  # not an action
    ]

    # start 1, local activity 1, activity 3 attempts + 1, timer, signal, update, upsert: 1 each
    assert billable_actions(history) == 10
