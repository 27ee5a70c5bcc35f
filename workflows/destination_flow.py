"""A destination's flow: the durable side of its throttle rule (`flowcontrol.throttle`) and of
its circuit (`flowcontrol.breaker`).

One per destination (`flow/{name}`), started by the first submit that meets a throttle or the
first worker process whose submits keep failing, and signalled by every one after it. For a
throttle it sleeps on a durable timer until the pause's end, resumes the submit queue (a local
activity: one RPC to the server) and steps a halved rate back up. For a failing destination it
opens the circuit (pauses the submit queue), probes the destination at intervals and closes the
circuit when probes succeed; one failing too long it disables (`flowcontrol.disable`). For an
adaptive destination it moves the submit rate at each interval by what the workers report of their
submits (`flowcontrol.adaptive`). It ends
once the rate is whole, the circuit closed and nothing came for a while. A worker killed
meanwhile changes nothing: the timers and the state are in the history.
"""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from durable_outbox_temporal.contract.flow import (
        BREAKER_SETTINGS_SIGNAL,
        FAILING_SIGNAL,
        FLOW_EVENT_ACTIVITY,
        FLOW_QUERY,
        FLOW_WORKFLOW_TYPE,
        NOTIFIED_KINDS,
        PROBE_ACTIVITY,
        SUBMIT_OUTCOMES_SIGNAL,
        THROTTLED_SIGNAL,
        BreakerSettings,
        Failing,
        FlowNotice,
        FlowState,
        ProbeResult,
        RateApplied,
        RateChange,
        SubmitOutcomes,
        Throttled,
    )

    from activities.flow import apply_flow_rate
    from flowcontrol import adaptive, breaker, disable, throttle
    from workflows.slow_local_activities import SlowLocalActivities

# Idle this long with the rate whole and the circuit closed, the flow ends (the next throttle
# or failing report starts it again).
LINGER = timedelta(minutes=5)
# Temporal briefly unreachable from the worker: tried again, for as long as it takes.
_RETRIES = RetryPolicy(
    initial_interval=timedelta(seconds=0.2), maximum_interval=timedelta(seconds=5)
)
# A probe is one request: one attempt, and no answer within this long (no worker serving the
# destination's poll queue, or the provider hanging) is a failed probe.
_PROBE_TIMEOUT = timedelta(seconds=30)
# An operational event is retried this long (Temporal or the operations worker away), then
# given up: the flow's own state and the API still say what happened.
_NOTICE_TIMEOUT = timedelta(hours=1)
# Runs from before endpoint disable never disable a destination on replay.
_DISABLE_PATCH = "endpoint-disable"
# A run whose history grew long while it lingered goes on in a new run, as a busy one does.
# Before, it ended: its state (when it last resumed, its storms, its events) was gone at once,
# so a storm coming back within the storm window started a fresh flow that did not see it come
# back and resumed at the whole rate. Runs from before keep ending on replay.
_LINGER_PATCH = "flow-lingers-across-runs"
# An adaptive rate falls once per congestion episode, to what the provider took (busy by what
# was sent), and remembers that as where congestion begins (`flowcontrol.adaptive.HOLD_OFF`).
# Runs from before move as they did on replay.
_EPISODES_PATCH = "adaptive-congestion-episodes"
# A task that runs while a rate change begun in an earlier task is still out (Temporal slow to
# take it, or refusing it and the change tried again) upserts the memo below from now on
# (`SlowLocalActivities`): the reports' handlers reckon from `now()`. Runs from before replay
# without it.
_SLOW_CHANGE_TASKS_PATCH = "flow-tasks-marked-while-a-change-is-slow"
SLOW_CHANGE_TASKS_MEMO = "tasks_while_rate_change_slow"


@workflow.defn(name=FLOW_WORKFLOW_TYPE)
class DestinationFlowWorkflow:
    @workflow.init
    def __init__(self, state: FlowState) -> None:
        self._state = state
        self._seen = 0
        self._seen_before = 0
        # The change that opens the circuit, asked for by a failing report.
        self._opening: RateChange | None = None
        # The change that closes it, asked for by the breaker turned off at run time.
        self._closing: RateChange | None = None
        # Events notified so far (`FlowState.events_recorded`), and the notices under way.
        self._notified = state.events_recorded
        self._notices: list[workflow.ActivityHandle[bool]] = []
        self._changes = SlowLocalActivities(_SLOW_CHANGE_TASKS_PATCH, SLOW_CHANGE_TASKS_MEMO)

    def _another_report(self) -> bool:
        return self._seen != self._seen_before

    @workflow.signal(name=THROTTLED_SIGNAL)
    def throttled(self, seen: Throttled) -> None:
        throttle.on_throttled(self._state, seen, workflow.now())
        self._seen += 1

    @workflow.signal(name=FAILING_SIGNAL)
    def failing(self, seen: Failing) -> None:
        change = breaker.on_failing(self._state, seen, workflow.now())
        if change is not None and self._opening is None:
            self._opening = change
        self._seen += 1

    @workflow.signal(name=BREAKER_SETTINGS_SIGNAL)
    def breaker_settings(self, settings: BreakerSettings) -> None:
        change = breaker.on_settings(self._state, settings, workflow.now())
        if change is not None and self._closing is None:
            self._closing = change
        self._seen += 1

    @workflow.signal(name=SUBMIT_OUTCOMES_SIGNAL)
    def submit_outcomes(self, seen: SubmitOutcomes) -> None:
        adaptive.on_outcomes(self._state, seen, workflow.now())
        self._seen += 1

    @workflow.query(name=FLOW_QUERY)
    def flow(self) -> FlowState:
        return self._state

    def _due(self) -> datetime | None:
        state = self._state
        times = [
            t
            for t in (
                throttle.due(state),
                breaker.due(state),
                self._disable_due(),
                adaptive.due(state),
            )
            if t
        ]
        return min(times) if times else None

    def _disable_due(self) -> datetime | None:
        """When the destination is to be disabled (`flowcontrol.disable`), in runs that can."""
        due = disable.due(self._state)
        return due if due is not None and workflow.patched(_DISABLE_PATCH) else None

    @workflow.run
    async def run(self, state: FlowState) -> FlowState:
        idle = False
        while not workflow.info().is_continue_as_new_suggested():
            self._notify()
            self._seen_before = self._seen
            due = self._due()
            asked = self._opening is not None or self._closing is not None
            if not asked and (due is None or due > workflow.now()):
                wait = LINGER if due is None else due - workflow.now()
                try:
                    await workflow.wait_condition(self._another_report, timeout=wait)
                    continue  # another report: the due time may have moved
                except TimeoutError:
                    pass
            if self._opening is not None:
                change, self._opening = self._opening, None
                breaker.opened(self._state, change, await self._apply(change), workflow.now())
                continue
            if self._closing is not None:
                change, self._closing = self._closing, None
                applied = await self._apply(change)
                breaker.closed(self._state, applied, workflow.now(), "breaker turned off")
                continue
            disable_at = self._disable_due()
            if disable_at is not None and disable_at <= workflow.now():
                change = disable.change(self._state, workflow.now())
                disable.disabled(self._state, change, await self._apply(change), workflow.now())
                continue
            probe_at = breaker.due(self._state)
            if probe_at is not None and probe_at <= workflow.now():
                closing = breaker.on_probe(self._state, await self._probe(), workflow.now())
                if closing is not None:
                    breaker.closed(self._state, await self._apply(closing), workflow.now())
                continue
            adapt_at = adaptive.due(self._state)
            if adapt_at is not None and adapt_at <= workflow.now():
                move = adaptive.next_change(
                    self._state, workflow.now(), episodes=workflow.patched(_EPISODES_PATCH)
                )
                if move is not None:
                    adaptive.applied(self._state, move, await self._apply(move), workflow.now())
                continue
            ramp = throttle.next_change(self._state, workflow.now())
            if ramp is None:
                if self._due() is None:
                    idle = True
                    break  # idle, the rate whole, the circuit closed
                continue
            throttle.applied(self._state, ramp, await self._apply(ramp), workflow.now())
        self._notify()
        await workflow.wait_condition(workflow.all_handlers_finished)
        # Events sent before the flow ends or goes on anew (their retries are bounded).
        for notice in self._notices:
            with contextlib.suppress(ActivityError):
                await notice
        goes_on = self._due() is not None or self._opening is not None or self._closing is not None
        # An adaptive rate goes on learning in a new run unless the flow ended idle (a run
        # from before adaptive rates has none: it ends as it did).
        if not goes_on and not idle and self._state.adaptive is None:
            # Still lingering when the history grew long: go on lingering in a new run.
            goes_on = workflow.patched(_LINGER_PATCH)
        if goes_on or (self._state.adaptive is not None and not idle):
            # A report came as the flow was ending, or the history grew long: go on anew.
            workflow.continue_as_new(self._state)
        return self._state

    def _notify(self) -> None:
        """Send each new event an operator is told of to `events_destination`, in the
        background (`activities/flow_events.py`)."""
        state = self._state
        new = state.since(self._notified)
        self._notified = state.events_recorded
        self._notices = [notice for notice in self._notices if not notice.done()]
        if state.events_destination is None or state.events_task_queue is None:
            return
        for event in new:
            if event.kind not in NOTIFIED_KINDS:
                continue
            notice = FlowNotice(
                destination=state.destination,
                events_destination=state.events_destination,
                event=event,
                circuit=state.circuit,
                paused_until=state.paused_until,
            )
            self._notices.append(
                workflow.start_activity(
                    FLOW_EVENT_ACTIVITY,
                    notice,
                    result_type=bool,
                    task_queue=state.events_task_queue,
                    schedule_to_close_timeout=_NOTICE_TIMEOUT,
                    retry_policy=_RETRIES,
                )
            )

    async def _apply(self, change: RateChange) -> RateApplied:
        return await self._changes.run(
            workflow.execute_local_activity(
                apply_flow_rate,
                change,
                start_to_close_timeout=timedelta(seconds=10),
                retry_policy=_RETRIES,
            )
        )

    async def _probe(self) -> ProbeResult:
        """One probe request, sent by a worker serving the destination's poll queue."""
        try:
            result: ProbeResult = await workflow.execute_activity(
                PROBE_ACTIVITY,
                self._state.destination,
                result_type=ProbeResult,
                task_queue=self._state.poll_task_queue,
                schedule_to_close_timeout=_PROBE_TIMEOUT,
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
        except ActivityError as err:
            cause = err.cause if err.cause is not None else err
            return ProbeResult(ok=False, detail=f"probe failed: {cause}")
        return result
