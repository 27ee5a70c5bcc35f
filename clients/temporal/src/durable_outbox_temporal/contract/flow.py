"""The destination flow workflow's names and payloads: one per destination, `flow/{name}`.

A submit that meets a throttle (429 or 503 with `Retry-After`) pauses its destination's submit
queue on the server and tells this workflow, which owns the resume: a durable timer to the
Retry-After time, then the rate back, halved while the storm keeps coming back and recovering
step by step (`flowcontrol.throttle`). A worker process whose submits keep failing tells it too
(`failing`): the workflow opens the destination's circuit, pauses its submit queue, probes the
destination at intervals and closes the circuit when probes succeed (`flowcontrol.breaker`).
A destination failing for `disable_after_s` is disabled: its submit queue stays paused until an
operator re-enables it (`flowcontrol.disable`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

FLOW_WORKFLOW_TYPE = "DestinationFlow"
THROTTLED_SIGNAL = "throttled"
FAILING_SIGNAL = "failing"
# The breaker's settings changed at run time (`PATCH /v1/destinations/{name}`).
BREAKER_SETTINGS_SIGNAL = "breaker_settings"
# A worker process's submit outcomes over the last interval, for an adaptive destination
# (`flowcontrol.adaptive`).
SUBMIT_OUTCOMES_SIGNAL = "submit_outcomes"
FLOW_QUERY = "flow"
# The local activity that sets the submit queue's rate as the ramp says.
APPLY_RATE_ACTIVITY = "apply_flow_rate"
# The operations worker's activity that enqueues a flow event to the destination's
# `events_destination` (an operational event: a throttle storm, a circuit opening or closing).
FLOW_EVENT_ACTIVITY = "send_flow_event"
# The outbox operational events are enqueued in, and the kinds sent.
FLOW_EVENTS_OUTBOX = "operations"
NOTIFIED_KINDS = ("throttled", "recovered", "opened", "closed", "disabled", "adapted")
# The activity that sends one probe request to a destination whose circuit is open; it runs on
# the destination's poll task queue, where its provider is and which the circuit leaves open.
PROBE_ACTIVITY = "probe_destination"
# Transitions a flow keeps to show (the newest).
FLOW_EVENTS_KEPT = 20
# Adaptive rate changes a flow keeps to show (the newest).
RATE_HISTORY_KEPT = 30


def flow_workflow_id(destination: str) -> str:
    return f"flow/{destination}"


@dataclass
class Throttled:
    """A submit met a throttle: the destination's submit queue is paused until `until`."""

    destination: str
    task_queue: str
    until: datetime
    seen_at: datetime
    status: int
    # The queue's configured rate (activities a second): a resume starts from it.
    configured_rate: float


@dataclass
class Failing:
    """A worker process's submits to a destination failed above its breaker's threshold."""

    destination: str
    task_queue: str
    # The destination's poll task queue: where the probes run.
    poll_task_queue: str
    failures: int
    submits: int
    window_s: float
    # The oldest failure counted: a circuit closed since then ignores this (stale) report.
    since: datetime
    seen_at: datetime
    last_error: str
    configured_rate: float
    probe_interval_s: float
    close_after: int
    # The first failure this process saw since its last successful submit (None: a process
    # from before endpoint disable); the flow disables a destination failing that long.
    failing_since: datetime | None = None
    # How long a destination fails before it is disabled (None: never).
    disable_after_s: float | None = None


@dataclass
class BreakerSettings:
    """The breaker settings in force after a change at run time: an open circuit probes at the
    new interval and closes after the new count; a breaker turned off closes it at once."""

    enabled: bool
    probe_interval_s: float
    close_after: int
    # How long a destination fails before it is disabled (None: never).
    disable_after_s: float | None = None


@dataclass
class ProbeResult:
    """One probe of a destination whose circuit is open: whether it answered well, and what."""

    ok: bool
    detail: str


@dataclass
class FlowEvent:
    """One transition of a destination's flow, as the API and dashboard show it."""

    at: datetime
    # "throttled", "resumed", "ramped", "recovered", "released" (someone else set the rate),
    # "opened", "probe_failed" or "closed" (the circuit); "disabled" (failing too long);
    # "adapted" (the adaptive rate moved by a third or more: `flowcontrol.adaptive`).
    kind: str
    detail: str
    # The submit queue's rate after it (activities a second; None: the configured rate).
    rate: float | None = None


@dataclass
class FlowNotice:
    """One flow event for an operator, enqueued as an item to `events_destination`."""

    destination: str
    events_destination: str
    event: FlowEvent
    # The flow's circuit and throttle state after it ("open"/"closed"; paused until when).
    circuit: str
    paused_until: datetime | None = None


@dataclass
class RateChange:
    """What the flow asks the submit queue's rate to become."""

    task_queue: str
    # "resume": only if the queue is still paused by a throttle; "ramp": only if the queue still
    # runs at `expected` (an operator's change since ends the ramp); "open": pause it for the
    # circuit (unless paused by hand); "close": resume it, only if the circuit's pause holds;
    # "disable": hold it paused until an operator re-enables it (unless paused by hand);
    # "adapt": set the adaptive rate, only if the queue runs unpaused at `expected` or at the
    # workers' rate (`flowcontrol.adaptive`).
    kind: str
    factor: float
    configured_rate: float
    expected: float | None = None
    # The rate a full recovery returns to (None: the configured one), when the flow knows it.
    base_rate: float | None = None
    # Whether the flow has set the queue's rate since the storms began (a ramp is under way).
    from_ramp: bool = False
    # "open" and "disable": why, for the pause's reason; the time it opened (was disabled).
    detail: str = ""
    since: datetime | None = None
    # "adapt": the rate to set (None: set nothing, read the rate in force: a flow adopting the
    # adaptive rate an earlier run of it left on the queue).
    rate: float | None = None
    # Put before the reason the rate is set with: an adaptive destination's resume after a
    # throttle says it is the adaptive rate's (`flowcontrol.adaptive`).
    reason_prefix: str = ""


@dataclass
class RateApplied:
    """The rate set (activities a second; None: back to the configured rate), or `released`
    when the queue was no longer the flow's to change."""

    rate: float | None = None
    released: bool = False
    # The rate a full recovery returns to: an operator's run-time rate from before the storm.
    base_rate: float | None = None
    # Set when the queue turned out to be paused for longer (another throttle): nothing changed.
    paused_until: datetime | None = None
    # "adapt": the queue is paused (a throttle, an open circuit, by hand): nothing changed.
    held: bool = False


@dataclass
class SubmitOutcomes:
    """What one worker process's submits to an adaptive destination met over an interval
    (`flowcontrol.adaptive`): answered within the latency target, answered above it, or
    congested (429, 503, a timeout or a connection error)."""

    destination: str
    task_queue: str
    ok: int
    slow: int
    congested: int
    seen_at: datetime
    configured_rate: float
    floor: float
    ceiling: float
    latency_target_s: float
    interval_s: float


@dataclass
class RatePoint:
    """One change of an adaptive destination's rate: when, to what and why."""

    at: datetime
    rate: float
    reason: str


@dataclass
class AdaptiveRate:
    """The rate an adaptive destination's flow holds its submit queue to, and what it has
    seen since it last changed it."""

    floor: float
    ceiling: float
    latency_target_s: float
    interval_s: float
    # The rate in force (activities a second), as the flow last set it.
    rate: float
    ok: int = 0
    slow: int = 0
    congested: int = 0
    adjusted_at: datetime | None = None
    # Whether the flow has read the rate in force (an earlier run's adaptive rate) yet.
    adopted: bool = False
    # The rate the last congestion came at: the steps up are small near it.
    congested_at: float | None = None
    # When the rate last fell to what the provider took: congestion reported within
    # `flowcontrol.adaptive.HOLD_OFF` intervals of it is that fall's lag, not a new one.
    decreased_at: datetime | None = None
    # The rate the last "adapted" event told of.
    told: float | None = None
    # An operator set the rate by hand: the flow leaves it until the hand rate is lifted.
    released: bool = False
    history: list[RatePoint] = field(default_factory=list)

    def changed(self, point: RatePoint) -> None:
        self.rate = point.rate
        self.history = [*self.history, point][-RATE_HISTORY_KEPT:]


@dataclass
class FlowState:
    """A destination flow's state: its input, its query's answer, carried across runs."""

    destination: str
    task_queue: str
    configured_rate: float
    ramp_step_s: float
    storm_window_s: float
    paused_until: datetime | None = None
    # The share of the rate the queue runs at: halved by each storm that comes back.
    factor: float = 1.0
    storms: int = 0
    resumed_at: datetime | None = None
    ramped_at: datetime | None = None
    # The rate the flow last set (activities a second), to know it is still the flow's.
    rate: float | None = None
    base_rate: float | None = None
    events: list[FlowEvent] = field(default_factory=list)
    # The circuit (`flowcontrol.breaker`): "closed" or "open".
    circuit: str = "closed"
    poll_task_queue: str = ""
    probe_interval_s: float = 15.0
    close_after: int = 1
    opened_at: datetime | None = None
    closed_at: datetime | None = None
    next_probe_at: datetime | None = None
    # Probes in a row that succeeded since the circuit opened (or the last failed probe).
    probes_ok: int = 0
    probes_failed: int = 0
    # What opened the circuit, then what the last failed probe met.
    last_error: str | None = None
    # Where operational events go (a destination's name; None: nowhere), and the operations
    # task queue whose worker enqueues them.
    events_destination: str | None = None
    events_task_queue: str | None = None
    # Events recorded since the flow began (`events` keeps the newest): what is new to notify.
    events_recorded: int = 0
    # Endpoint disable (`flowcontrol.disable`): after how long failing (None: never), failing
    # since when (no submit known to have succeeded since), and when the flow disabled it.
    disable_after_s: float | None = None
    failing_since: datetime | None = None
    disabled_at: datetime | None = None
    # The adaptive rate (`flowcontrol.adaptive`); None: the destination is not adaptive.
    adaptive: AdaptiveRate | None = None

    def record(self, event: FlowEvent) -> None:
        self.events = [*self.events, event][-FLOW_EVENTS_KEPT:]
        self.events_recorded += 1

    def since(self, recorded: int) -> list[FlowEvent]:
        """The events recorded after the first `recorded` (as many as are kept)."""
        new = self.events_recorded - recorded
        return self.events[-new:] if new > 0 else []
