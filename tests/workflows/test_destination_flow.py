"""The destination flow workflow's circuit on the dev server (queue config is real): a failing
report pauses the submit queue with the circuit's reason, probes go at intervals, the circuit
closes on a probe that succeeds and the queue gets back the run-time rate it had; a pause by
hand is left alone; a destination failing past `disable_after_s` is disabled; an adaptive
destination's congested submits lower its rate (`workflows/destination_flow.py`,
`activities/flow.py`, `flowcontrol/disable.py`, `flowcontrol/adaptive.py`). Each test records its
flow's history for the replay archive (`RECORD_HISTORIES=1`).

The probe here is a stand-in activity on the poll queue whose answers the test chooses; the
providers' real probes run in `tests/api/test_breaker.py`."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
import pytest_asyncio
from durable_outbox_temporal.contract.flow import (
    BREAKER_SETTINGS_SIGNAL,
    FAILING_SIGNAL,
    FLOW_QUERY,
    FLOW_WORKFLOW_TYPE,
    PROBE_ACTIVITY,
    SUBMIT_OUTCOMES_SIGNAL,
    BreakerSettings,
    Failing,
    FlowState,
    ProbeResult,
    SubmitOutcomes,
)
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowQueryFailedError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.flow import apply_flow_rate
from flowcontrol.queue_rates import pause_queue, read_queue_rate, set_queue_rate
from tests.conftest import record_history, unique_name
from workflows.destination_flow import DestinationFlowWorkflow


@dataclass
class Probes:
    """The stand-in probe's answers, taken in turn (the last one repeats)."""

    answers: list[bool] = field(default_factory=lambda: [False])
    sent: int = 0

    @activity.defn(name=PROBE_ACTIVITY)
    async def probe(self, destination: str) -> ProbeResult:
        ok = self.answers[min(self.sent, len(self.answers) - 1)]
        self.sent += 1
        return ProbeResult(ok=ok, detail="HTTP 204" if ok else "HTTP 503")


def failing_report(
    destination: str,
    submit_queue: str,
    poll_queue: str,
    *,
    probe_interval_s: float = 0.3,
    disable_after_s: float | None = None,
) -> Failing:
    """A worker's report that five of its five submits failed (HTTP 502) just now."""
    now = datetime.now(UTC)
    return Failing(
        destination=destination,
        task_queue=submit_queue,
        poll_task_queue=poll_queue,
        failures=5,
        submits=5,
        window_s=10.0,
        since=now,
        seen_at=now,
        last_error="HTTP 502",
        configured_rate=4.0,
        probe_interval_s=probe_interval_s,
        close_after=2,
        failing_since=now,
        disable_after_s=disable_after_s,
    )


@dataclass
class Flow:
    client: Client
    destination: str
    submit_queue: str
    poll_queue: str
    workflow_queue: str
    probes: Probes

    async def report(self, disable_after_s: float | None = None) -> None:
        seen = failing_report(
            self.destination, self.submit_queue, self.poll_queue, disable_after_s=disable_after_s
        )
        await self._signal_with_start(FAILING_SIGNAL, seen)

    async def report_outcomes(self, *, ok: int, congested: int) -> None:
        """One worker's submit outcomes over an interval, as an adaptive destination's submits
        report them (`flowcontrol.guard`): the flow starts with them."""
        outcomes = SubmitOutcomes(
            destination=self.destination,
            task_queue=self.submit_queue,
            ok=ok,
            slow=0,
            congested=congested,
            seen_at=datetime.now(UTC),
            configured_rate=4.0,
            floor=1.0,
            ceiling=4.0,
            latency_target_s=1.0,
            interval_s=0.3,
        )
        await self._signal_with_start(SUBMIT_OUTCOMES_SIGNAL, outcomes)

    async def _signal_with_start(self, signal: str, report: object) -> None:
        """The report to the destination's flow, starting it if it is not running."""
        await self.client.start_workflow(
            FLOW_WORKFLOW_TYPE,
            FlowState(
                destination=self.destination,
                task_queue=self.submit_queue,
                configured_rate=4.0,
                ramp_step_s=1.0,
                storm_window_s=30.0,
            ),
            id=f"flow/{self.destination}",
            task_queue=self.workflow_queue,
            start_signal=signal,
            start_signal_args=[report],
        )

    async def state(self) -> FlowState:
        handle = self.client.get_workflow_handle(f"flow/{self.destination}")
        found: FlowState = await handle.query(FLOW_QUERY, result_type=FlowState)
        return found

    async def record(self) -> None:
        """The flow's history so far, for the replay archive (the flow lingers: it is open)."""
        await record_history(self.client, f"flow/{self.destination}", "_flow")


@pytest_asyncio.fixture(loop_scope="session")
async def flow(dev_env: WorkflowEnvironment) -> AsyncIterator[Flow]:
    client = dev_env.client
    name = unique_name("flow")
    found = Flow(client, name, f"{name}-submit", f"{name}-poll", f"{name}-workflows", Probes())
    async with (
        Worker(
            client,
            task_queue=found.workflow_queue,
            workflows=[DestinationFlowWorkflow],
            activities=[apply_flow_rate],
        ),
        Worker(client, task_queue=found.poll_queue, activities=[found.probes.probe]),
    ):
        try:
            yield found
        finally:
            with contextlib.suppress(Exception):
                await client.get_workflow_handle(f"flow/{name}").terminate("test over")


async def until(check: object, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.1)):
        with contextlib.suppress(RPCError, WorkflowQueryFailedError):  # not started yet
            if await check():  # type: ignore[operator]
                return
        await asyncio.sleep(0.1)
    raise AssertionError("never happened")


async def set_by_hand(client: Client, queue: str, rate: float) -> None:
    """A run-time rate, read back before going on: the server applies an accepted change a
    moment later, and a flow reading the rate before then would remember the one before."""
    await set_queue_rate(client, queue, rate, "set by hand", identity="test")

    async def stored() -> bool:
        now = await read_queue_rate(client, queue)
        return now.source == "api" and math.isclose(now.rate, rate, rel_tol=1e-6)

    await until(stored)


async def test_the_circuit_opens_probes_and_closes_back_to_the_run_time_rate(flow: Flow) -> None:
    client = flow.client
    # A run-time rate the circuit's close must give back.
    await set_by_hand(client, flow.submit_queue, 2.5)
    flow.probes.answers = [False, False, True, False, True, True]
    await flow.report()

    async def paused() -> bool:
        return (await read_queue_rate(client, flow.submit_queue)).circuit_open_since is not None

    await until(paused)
    now = await read_queue_rate(client, flow.submit_queue)
    assert now.paused and now.rate == 0 and now.resume_rate == 2.5
    assert "5 of 5 submits" in (now.pause_reason or "")

    async def closed() -> bool:
        return (await flow.state()).circuit == "closed"

    await until(closed)
    state = await flow.state()
    after = await read_queue_rate(client, flow.submit_queue)
    assert not after.paused and after.rate == 2.5 and after.source == "api"
    # Two in a row needed: the lone success between failures did not close it.
    assert flow.probes.sent == 6 and state.probes_failed == 3
    kinds = [event.kind for event in state.events]
    assert kinds == ["opened", "probe_failed", "probe_failed", "probe_failed", "closed"], kinds
    await flow.record()


async def test_a_pause_by_hand_stays_through_the_circuit(flow: Flow) -> None:
    client = flow.client
    for attempt in range(5):
        now = await read_queue_rate(client, flow.submit_queue)
        try:
            await pause_queue(client, flow.submit_queue, now, "maintenance", identity="test")
            break
        except RPCError as err:
            # The server cancels a queue update that meets the flow's own (it applies the
            # configured rate as it starts); the API answers that 503, an operator retries.
            if err.status is not RPCStatusCode.CANCELLED or attempt == 4:
                raise
    flow.probes.answers = [True]
    await flow.report()

    async def closed() -> bool:
        state = await flow.state()
        return state.circuit == "closed" and bool(state.events)

    await until(closed)
    after = await read_queue_rate(client, flow.submit_queue)
    assert after.paused and after.pause_reason == "maintenance"
    kinds = [event.kind for event in (await flow.state()).events]
    assert kinds == ["opened", "closed"], kinds
    await flow.record()


async def test_a_circuit_open_past_disable_after_disables_the_destination(flow: Flow) -> None:
    client = flow.client
    await set_by_hand(client, flow.submit_queue, 2.5)
    flow.probes.answers = [False]
    await flow.report(disable_after_s=1.0)

    async def disabled() -> bool:
        return (await read_queue_rate(client, flow.submit_queue)).disabled_since is not None

    await until(disabled)
    now = await read_queue_rate(client, flow.submit_queue)
    # Held at zero with the rate a re-enable gives back; no longer the circuit's pause.
    assert now.paused and now.rate == 0 and now.resume_rate == 2.5
    assert now.circuit_open_since is None
    # Why, with what it last met (the report that opened it, or a failed probe).
    assert "failing for" in (now.pause_reason or "") and "; last: " in (now.pause_reason or "")
    state = await flow.state()
    assert state.disabled_at is not None and state.circuit == "closed"
    assert state.next_probe_at is None and state.failing_since is None
    kinds = [event.kind for event in state.events]
    assert kinds[0] == "opened" and kinds[-1] == "disabled", kinds
    assert set(kinds[1:-1]) <= {"probe_failed"}, kinds
    await flow.record()


async def test_congested_submits_lower_an_adaptive_rate_on_the_server(flow: Flow) -> None:
    client = flow.client
    # Submits that met only congestion, and none answered: the rate falls to MAX_DECREASE of
    # the configured 4/s (`flowcontrol.adaptive`), after the flow adopted the rate in force.
    await flow.report_outcomes(ok=0, congested=5)

    async def lowered() -> bool:
        adaptive = (await flow.state()).adaptive
        return adaptive is not None and bool(adaptive.history)

    await until(lowered)
    state = await flow.state()
    assert state.adaptive is not None and state.adaptive.adopted
    [point] = state.adaptive.history
    assert point.rate == pytest.approx(2.8) and "5 congested" in point.reason
    now = await read_queue_rate(client, flow.submit_queue)
    assert not now.paused and now.rate == pytest.approx(2.8) and now.source == "api"
    # A new run moves by congestion episodes (`flowcontrol.adaptive.HOLD_OFF`): its history
    # holds that patch's marker, which a run from before does not.
    history = await client.get_workflow_handle(f"flow/{flow.destination}").fetch_history()
    patches = [
        # The patch id is in the marker's details (their layout is the SDK's).
        event.marker_recorded_event_attributes.SerializeToString()
        for event in history.events
        if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        and event.marker_recorded_event_attributes.marker_name == "core_patch"
    ]
    assert any(b"adaptive-congestion-episodes" in data for data in patches), patches
    await flow.record()


async def test_a_flow_whose_history_grew_long_while_it_lingers_goes_on_in_a_new_run(
    flow: Flow,
) -> None:
    """This dev server suggests continue-as-new at 40 events (`tests/conftest.py`). A flow with
    nothing due, lingering, whose history grows past that (reports that change nothing) goes
    on in a new run with its state: it ended before, and a storm coming back within the storm
    window then started a fresh flow that did not see it come back (the throttle API test lost
    the recovered flow's state this way under load)."""
    settings = BreakerSettings(enabled=True, probe_interval_s=0.3, close_after=2)
    await flow._signal_with_start(BREAKER_SETTINGS_SIGNAL, settings)
    handle = flow.client.get_workflow_handle(f"flow/{flow.destination}")
    first_run = (await handle.describe()).run_id

    async def went_on() -> bool:
        description = await flow.client.get_workflow_handle(f"flow/{flow.destination}").describe()
        return description.run_id != first_run and description.status == (
            WorkflowExecutionStatus.RUNNING
        )

    # Reports until it goes on: each is an event at least, so 40 pass the suggestion however
    # many a workflow task takes at once (a loaded CI run batched a fixed 15 into too few).
    for _ in range(60):
        await handle.signal(BREAKER_SETTINGS_SIGNAL, settings)
        if await went_on():
            break
    await until(went_on)
    state = await flow.state()
    assert state.circuit == "closed" and state.close_after == 2
    # The run that went on anew, for the replay archive: it holds the patch's marker.
    await record_history(flow.client, f"flow/{flow.destination}", "_flow", run_id=first_run)
