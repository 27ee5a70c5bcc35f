"""The destination flow workflow's names and payloads: one per destination, `flow/{name}`.

A submit that meets a throttle (429 or 503 with `Retry-After`) pauses its destination's submit
queue on the server and tells this workflow, which owns the resume: a durable timer to the
Retry-After time, then the rate back, halved while the storm keeps coming back and recovering
step by step (`flowcontrol.throttle`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

FLOW_WORKFLOW_TYPE = "DestinationFlow"
THROTTLED_SIGNAL = "throttled"
FLOW_QUERY = "flow"
# The local activity that sets the submit queue's rate as the ramp says.
APPLY_RATE_ACTIVITY = "apply_flow_rate"
# Transitions a flow keeps to show (the newest).
FLOW_EVENTS_KEPT = 20


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
class FlowEvent:
    """One transition of a destination's flow, as the API and dashboard show it."""

    at: datetime
    # "throttled", "resumed", "ramped", "recovered" or "released" (someone else set the rate).
    kind: str
    detail: str
    # The submit queue's rate after it (activities a second; None: the configured rate).
    rate: float | None = None


@dataclass
class RateChange:
    """What the flow asks the submit queue's rate to become."""

    task_queue: str
    # "resume": only if the queue is still paused by a throttle; "ramp": only if the queue still
    # runs at `expected` (an operator's change since ends the ramp).
    kind: str
    factor: float
    configured_rate: float
    expected: float | None = None
    # The rate a full recovery returns to (None: the configured one), when the flow knows it.
    base_rate: float | None = None
    # Whether the flow has set the queue's rate since the storms began (a ramp is under way).
    from_ramp: bool = False


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
