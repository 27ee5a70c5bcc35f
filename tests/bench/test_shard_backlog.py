"""The shard backlog scenario's reading of a shard's histories (`bench/shard_backlog.py`): each
workflow task's time from started to completed, and a failed task fails the run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

from bench.shard_backlog import RunTasks, figures_of, run_tasks

T0 = datetime(2026, 11, 29, 18, 0, tzinfo=UTC)


def event(event_id: int, kind: int, at_ms: int, **attributes: object) -> HistoryEvent:
    found = HistoryEvent(event_id=event_id, event_type=kind)  # type: ignore[arg-type]
    found.event_time.FromDatetime(T0 + timedelta(milliseconds=at_ms))
    if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
        found.workflow_task_completed_event_attributes.started_event_id = attributes["started"]  # type: ignore[assignment]
    if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
        found.workflow_task_failed_event_attributes.failure.message = str(attributes["message"])
    return found


def test_each_task_is_timed_from_started_to_completed_and_failures_kept() -> None:
    started, completed = (
        EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
        EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
    )
    events = [
        event(3, started, 0),
        event(4, EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED, 2100, message="deadlock"),
        event(6, started, 2200),
        event(7, completed, 3100, started=6),
        event(9, started, 4000),
        event(10, completed, 4020, started=9),
        event(11, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW, 4020),
    ]

    tasks = run_tasks(events)

    assert tasks.durations_ms == [900.0, 20.0]
    assert tasks.failures == ["deadlock"]
    assert tasks.continued
    assert not run_tasks(events[:-1]).continued


def test_the_figures_take_each_runs_first_and_continuing_tasks_and_every_failure() -> None:
    runs = [
        RunTasks([1500.0, 20.0, 30.0], continued=True),
        RunTasks([800.0, 2500.0], ["payload too large"]),
        RunTasks(),
    ]

    figures = figures_of(runs)

    assert figures["shard_runs"] == 3
    assert figures["shard_first_task_ms"] == 1500.0
    # Only a run that continued as new: the other's last task ended it.
    assert figures["shard_continue_task_ms"] == 30.0
    assert figures["shard_task_max_ms"] == 2500.0
    assert figures["shard_task_p50_ms"] == 800.0
    assert figures["shard_failed_tasks"] == ["payload too large"]
