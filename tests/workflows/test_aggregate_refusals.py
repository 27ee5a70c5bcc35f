"""A signalled command that `decide` judged by the clock replays as it was decided, also when
its task waited on a slow store: that task sends a command, so a replay never takes it together
with the tasks after it under a later time (temporalio/sdk-rust#1606;
docs/decisions/aggregate-passivation.md). Before, a worker that replayed such a run (after a
restart, or a run evicted from its cache) held another state than the one stored."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from durable_outbox_temporal.aggregate_definition import (
    AggregateDefinition,
    Command,
    Event,
    InvalidCommand,
)
from durable_outbox_temporal.aggregates import AggregateClient
from durable_outbox_temporal.contract.aggregate import (
    STORE_ACTIVITY,
    AggregateInput,
    aggregate_workflow_id,
)
from durable_outbox_temporal.contract.aggregate import (
    WORKFLOW_TYPE as AGGREGATE_WORKFLOW,
)
from pydantic import BaseModel
from sqlalchemy import Engine
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory
from temporalio.worker import (
    Replayer,
)

from readmodel import aggregates as event_store
from service.aggregate_types import load_aggregate_types
from tests.conftest import unique_name
from tests.workflows.held_activities import HoldActivities
from tests.workflows.test_effects import eventually
from worker import WORKFLOWS, SandboxCheckingOnce
from workflows.aggregate import SLOW_STORE_TASKS_MEMO
from workflows.aggregate_types import host


class Open(Command):
    until: datetime


class Close(Command):
    pass


class Note(Command):
    pass


class Opened(Event):
    until: datetime


class Closed(Event):
    pass


class Noted(Event):
    pass


class TooEarly(InvalidCommand):
    """Closed before its time."""


class TooLate(InvalidCommand):
    """A note after the window closed."""


class WindowState(BaseModel):
    until: datetime | None = None
    notes: int = 0
    closed: bool = False


class Window(AggregateDefinition[WindowState]):
    """Notes are taken until the window's time, and it closes only after: both by `now`."""

    type_name = "window"
    state_model = WindowState
    commands = {"open": Open, "close": Close, "note": Note}
    events = (Opened, Closed, Noted)

    def initial_state(self) -> WindowState:
        return WindowState()

    def decide(self, state: WindowState, command: Command, now: datetime) -> list[Event]:
        match command:
            case Open(until=until):
                return [Opened(until=until)]
            case Close():
                if state.until is None or now < state.until:
                    raise TooEarly(f"open until {state.until}")
                return [Closed()]
            case Note():
                if state.until is not None and now >= state.until:
                    raise TooLate(f"closed at {state.until}")
                return [Noted()]
        raise InvalidCommand(f"window does not handle {type(command).__name__}")

    def evolve(self, state: WindowState, event: Event) -> WindowState:
        match event:
            case Opened(until=until):
                return WindowState(until=until)
            case Noted():
                return state.model_copy(update={"notes": state.notes + 1})
            case Closed():
                return state.model_copy(update={"closed": True})
        return state


WINDOW = Window()
# The run's task timeout: a workflow task waiting on a local activity is completed with no
# command at four fifths of it (1.2 s here), the next one scheduled at once.
TASK_TIMEOUT = timedelta(seconds=1.5)
HEARTBEAT = TASK_TIMEOUT * 0.8


@pytest.mark.parametrize(
    ("signalled", "rejected"),
    [
        pytest.param("close", 1, id="refused: no event to store"),
        pytest.param("note", 0, id="accepted while a store is out"),
    ],
)
async def test_a_signalled_command_decided_by_the_clock_while_a_store_is_slow_replays_alike(
    stack_factory, dev_env, signalled: str, rejected: int
) -> None:
    types = load_aggregate_types(f"{__name__}:WINDOW")
    # The store of the first note is held past two of its task's heartbeats (1.2 s and 2.4 s
    # after it started): the signal below comes before the first, and the task after that
    # heartbeat decides it; before this change, that task sent no command and the second
    # heartbeat completed it.
    hold = HoldActivities(STORE_ACTIVITY, HEARTBEAT.total_seconds() * 2.5)
    stack = await stack_factory(env=dev_env, aggregate_types=types, interceptors=[hold])
    client = AggregateClient(stack.client, stack.task_queue, definitions=[WINDOW])
    window = unique_name("w")
    workflow_id = aggregate_workflow_id("window", window)
    handle = await stack.client.start_workflow(
        AGGREGATE_WORKFLOW,
        AggregateInput(type="window", id=window),
        id=workflow_id,
        task_queue=stack.task_queue,
        task_timeout=TASK_TIMEOUT,
    )
    # Open until half-way between the two heartbeats.
    until = datetime.now(UTC) + HEARTBEAT * 1.5
    await client.command("window", window, "open", {"until": until.isoformat()})
    hold.held = True
    await client.send("window", window, "note", {}, command_id="first")
    await asyncio.sleep(0.2)
    await client.send("window", window, signalled, {}, command_id="early")
    # Decided before the window's time: refused (close) or taken (note). On a machine too
    # loaded to signal within the window's 1.8 s, the task that decided it came after the
    # window's time, and the run cannot show what this test is about.
    await eventually(lambda: _decided(client, window))
    so_far = (await handle.fetch_history()).events
    if so_far[_task_after_signal(so_far, "early") - 1].event_time.ToDatetime(UTC) >= until:
        pytest.skip("the signal was decided after the window's time: too late to tell")
    assert await _decided(client, window) == (3 - rejected, rejected)
    hold.held = False
    stored = 2 + (1 - rejected)
    await eventually(lambda: _stored(stack.engine, window, version=stored))
    # After the window's time, the run goes on: it closes.
    assert (await client.command("window", window, "close", {})).version == stored + 1
    assert await (await handle.describe()).memo_value(SLOW_STORE_TASKS_MEMO) >= 1

    events = (await handle.fetch_history()).events
    decided = _task_after_signal(events, "early")
    # The task that decided the signal sent a command, and the next task came at once (the
    # store was still out; after the patch's marker and search attribute, the run's first use).
    scheduled = next(
        i
        for i, e in enumerate(events)
        if i > decided and e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED
    )
    assert events[scheduled - 1].event_type == EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED
    # That task started before the window's time, and the task that took the store's result
    # after it: decided under that task's time, the signal would come out otherwise.
    result = next(
        i
        for i, e in enumerate(events)
        if i > scheduled and e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
    )
    assert events[decided - 1].event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED
    assert events[result - 2].event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED
    decided_at = events[decided - 1].event_time.ToDatetime(UTC)
    result_at = events[result - 2].event_time.ToDatetime(UTC)
    assert decided_at < until < result_at, "the window's time came while the store was held"

    # A worker that never ran the run replays it to answer: the state it was left in.
    await stack.shutdown()
    restarted = await stack_factory(env=dev_env, task_queue=stack.task_queue, aggregate_types=types)
    replayed = await AggregateClient(
        restarted.client, restarted.task_queue, definitions=[WINDOW]
    ).state("window", window)
    assert replayed.version == stored + 1 and replayed.rejected == rejected
    assert replayed.state == {
        "until": replayed.state["until"],
        "notes": 2 - rejected,
        "closed": True,
    }
    host([WINDOW])
    await Replayer(workflows=WORKFLOWS, workflow_runner=SandboxCheckingOnce()).replay_workflow(
        WorkflowHistory(workflow_id, events)
    )


async def _decided(client: AggregateClient, window: str) -> tuple[int, int] | None:
    """The window's version and refused commands once the open and both notes are decided."""
    view = await client.state("window", window)
    return (view.version, view.rejected) if view.version + view.rejected == 3 else None


async def _stored(engine: Engine, window: str, *, version: int) -> bool:
    record = await asyncio.to_thread(event_store.get, engine, "window", window)
    return record is not None and record.version == version


def _task_after_signal(events: list[HistoryEvent], command_id: str) -> int:
    """The index of the completion of the task that took the signal carrying `command_id`."""
    signal = next(
        i
        for i, e in enumerate(events)
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        and command_id.encode() in e.SerializeToString()
    )
    return next(
        i
        for i, e in enumerate(events)
        if i > signal and e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    )
