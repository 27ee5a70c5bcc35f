"""Destinations at run time: the rates in force, changed without a restart, pause/resume, and
the flow-control rules (breaker, caps, quotas) changed at run time.

The Temporal server enforces rates and pauses on the destination's submit and poll task queues,
across all workers, and keeps them across restarts of every process; flow rules changed here are
kept in the read model, and every worker applies them within seconds (see
`service.destinations`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from durable_outbox_temporal.contract.flow import AdaptiveRate
from durable_outbox_temporal.contract.flow_policy import FlowPolicyPatch
from durable_outbox_temporal.destinations import MIN_RATE
from fastapi import APIRouter, Body
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from api.deps import DestinationControlsDep
from api.errors import validation_problem
from api.schemas import problem_responses
from service.destinations import MAX_REASON, DestinationState, FlowPolicyInForce

router = APIRouter(
    prefix="/v1/destinations",
    tags=["destinations"],
    responses=problem_responses(401, 403, 404, 422, 501, 503),
)


class QueueRateInfo(BaseModel):
    """One task queue's rate in force."""

    rate: float = Field(description="Activities per second the server dispatches (0: paused)")
    source: str = Field(description="'api' (set at run time) or 'worker' (the configured rate)")


class FlowEventInfo(BaseModel):
    """One transition of the destination's flow control."""

    at: datetime
    kind: str = Field(
        description="throttled, resumed, ramped, recovered or released (the throttle);"
        " opened, probe_failed or closed (the circuit); disabled (failing too long); adapted"
        " (the adaptive rate moved by a third or more, or a hand rate was lifted)"
    )
    detail: str
    rate: float | None = Field(description="The submit queue's rate after it (null: configured)")


class RatePointInfo(BaseModel):
    """One move of the adaptive rate."""

    at: datetime
    rate: float = Field(description="Submits per second after it")
    reason: str = Field(description="What the workers reported over the interval before it")


class AdaptiveInfo(BaseModel):
    """The adaptive rate at work (`flowcontrol/adaptive.py`)."""

    rate: float = Field(description="The submit rate in force, a second, as the flow last set it")
    floor: float
    ceiling: float
    latency_target_s: float
    interval_s: float
    released: bool = Field(
        description="An operator's rate set by hand holds: the adaptive rate waits until it is"
        " lifted (`PATCH` with `submit_rate: null`)"
    )
    history: list[RatePointInfo] = Field(description="The newest moves, oldest first")


class FlowInfo(BaseModel):
    """The destination's throttle rule, circuit and adaptive rate at work
    (`flowcontrol/throttle.py`, `flowcontrol/breaker.py`, `flowcontrol/adaptive.py`)."""

    storms: int = Field(description="Throttles met since the flow started")
    factor: float = Field(description="The share of the submit rate it runs at (1: whole)")
    circuit: str = Field(default="closed", description="'open' or 'closed'")
    opened_at: datetime | None = Field(default=None, description="When the circuit last opened")
    next_probe_at: datetime | None = Field(
        default=None, description="While open: when the next probe goes"
    )
    probes_failed: int = Field(default=0, description="Probes failed since it opened")
    last_error: str | None = Field(
        default=None, description="What opened the circuit, then what the last probe met"
    )
    failing_since: datetime | None = Field(
        default=None,
        description="Failing since then, as far as the workers know (no submit succeeded"
        " since); failing for `disable_after_s`, the destination is disabled",
    )
    disabled_at: datetime | None = Field(
        default=None, description="When this flow disabled the destination"
    )
    adaptive: AdaptiveInfo | None = Field(
        default=None, description="The adaptive rate (null: the destination is not adaptive)"
    )
    events: list[FlowEventInfo] = Field(description="The newest transitions, oldest first")


class FlowPolicyField(BaseModel):
    """One flow-control field in force, and where its value comes from."""

    value: Any
    source: Literal["file", "api"] = Field(
        description="'file': the destinations file (or its environment override); 'api': set"
        " by `PATCH /v1/destinations/{name}` (`null` there puts it back)"
    )
    changed_at: datetime | None = Field(
        default=None, description="When it was set at run time (source 'api')"
    )


def flow_policy_info(in_force: FlowPolicyInForce) -> dict[str, FlowPolicyField]:
    values = in_force.policy.model_dump(mode="json")
    return {
        name: FlowPolicyField(
            value=value,
            source=in_force.source(name),
            changed_at=found.changed_at if (found := in_force.overrides.get(name)) else None,
        )
        for name, value in values.items()
    }


class DestinationInfoFull(BaseModel):
    """A destination: its configuration, the rates the server enforces now, and pause state."""

    name: str
    provider: str
    configured_submit_rate: float
    configured_poll_rate: float
    # The submit activity makes each operation's first poll (its rate then counts in `poll`).
    poll_in_submit: bool = False
    submit: QueueRateInfo
    poll: QueueRateInfo
    paused: bool
    pause_reason: str | None
    paused_until: datetime | None = Field(
        default=None,
        description="Paused by a provider's throttle (429/503 with Retry-After) until then; the"
        " destination resumes by itself",
    )
    circuit: str = Field(
        default="closed",
        description="'open' while the destination's circuit holds its submits (its submits kept"
        " failing; it closes when a probe succeeds), else 'closed'",
    )
    disabled: bool = Field(
        default=False,
        description="Disabled after failing for `disable_after_s` (or by hand): its submits"
        ' stay paused, items wait, until `PATCH {"enabled": true}`',
    )
    disabled_since: datetime | None = Field(default=None, description="While disabled: since")
    flow: FlowInfo | None = Field(
        default=None,
        description="The throttle rule and the circuit at work, while they are (one"
        " destination's GET only)",
    )
    # While paused: the run-time rate a resume restores (null: the configured rate).
    resume_submit_rate: float | None
    resume_poll_rate: float | None
    flow_policy: dict[str, FlowPolicyField] | None = Field(
        default=None,
        description="The flow-control rules in force (`[destinations.<name>.flow]`), each with"
        " its source (one destination's GET, and a PATCH that changed `flow`)",
    )
    in_flight: int | None = Field(
        default=None,
        description="Submits and polls out now under `max_in_flight`, counted across every"
        " worker (one destination's GET, while a cap is set)",
    )


class DestinationPatch(BaseModel):
    """What to change; omitted fields stay as they are."""

    model_config = ConfigDict(extra="forbid")

    # A rate below the minimum would never deliver (one request in over 16 minutes).
    submit_rate: float | None = Field(default=None, ge=MIN_RATE, le=10_000)
    poll_rate: float | None = Field(default=None, ge=MIN_RATE, le=10_000)
    # true or false only: "yes" or 1 is a 422, not a pause.
    paused: bool | None = Field(default=None, strict=True)
    enabled: bool | None = Field(
        default=None,
        strict=True,
        description="true: re-enable a destination disabled after failing too long (its submits"
        " resume at the rate they had); false: disable it by hand (`flowcontrol/disable.py`)",
    )
    reason: str | None = Field(
        default=None,
        max_length=MAX_REASON,
        description="With `paused` or `enabled`: why it is paused or disabled (`pause_reason`),"
        " or resumed or re-enabled (recorded on its task queues); refused without either",
    )
    flow: FlowPolicyPatch | None = Field(
        default=None,
        description="Flow-control fields to change at run time (breaker, caps, quotas), each"
        ' validated as in the destinations file but strictly (`"3"` is no number); `null`'
        " for a field puts the file's back",
    )

    @field_validator("reason")
    @classmethod
    def _reason_with_paused(cls, reason: str | None, info: ValidationInfo) -> str | None:
        # A reason is a pause's (shown as `pause_reason`) or a resume's (the dashboard sends
        # one); without either nobody would ever read it. (`paused` is validated first, and
        # is missing from `data` when it was invalid: that error says enough.)
        given = {name: info.data.get(name, False) for name in ("paused", "enabled")}
        if reason is not None and all(value is None for value in given.values()):
            raise ValueError("a reason goes with paused or enabled: true or false")
        return reason


def adaptive_info(adaptive: AdaptiveRate | None) -> AdaptiveInfo | None:
    if adaptive is None:
        return None
    return AdaptiveInfo(
        rate=adaptive.rate,
        floor=adaptive.floor,
        ceiling=adaptive.ceiling,
        latency_target_s=adaptive.latency_target_s,
        interval_s=adaptive.interval_s,
        released=adaptive.released,
        history=[RatePointInfo(**vars(point)) for point in adaptive.history],
    )


def destination_info(state: DestinationState) -> DestinationInfoFull:
    destination = state.destination
    return DestinationInfoFull(
        name=destination.name,
        provider=destination.provider,
        configured_submit_rate=destination.submit_rate,
        configured_poll_rate=destination.poll_rate,
        poll_in_submit=destination.poll_in_submit,
        submit=QueueRateInfo(rate=state.submit.rate, source=state.submit.source),
        poll=QueueRateInfo(rate=state.poll.rate, source=state.poll.source),
        paused=state.paused,
        pause_reason=state.submit.pause_reason or state.poll.pause_reason,
        paused_until=state.submit.paused_until,
        circuit=state.circuit,
        disabled=state.disabled,
        disabled_since=state.submit.disabled_since,
        flow=None
        if state.flow is None
        else FlowInfo(
            storms=state.flow.storms,
            factor=state.flow.factor,
            circuit=state.flow.circuit,
            opened_at=state.flow.opened_at,
            next_probe_at=state.flow.next_probe_at,
            probes_failed=state.flow.probes_failed,
            last_error=state.flow.last_error,
            failing_since=state.flow.failing_since,
            disabled_at=state.flow.disabled_at,
            adaptive=adaptive_info(state.flow.adaptive),
            events=[FlowEventInfo(**vars(event)) for event in state.flow.events],
        ),
        resume_submit_rate=state.submit.resume_rate,
        resume_poll_rate=state.poll.resume_rate,
        flow_policy=None if state.flow_policy is None else flow_policy_info(state.flow_policy),
        in_flight=state.in_flight,
    )


@router.get("", response_model=list[DestinationInfoFull], summary="Destinations and rates in force")
async def list_destinations(controls: DestinationControlsDep) -> list[DestinationInfoFull]:
    """Every configured destination, with the rates the server enforces now."""
    return [destination_info(state) for state in await controls.states()]


@router.get("/{name}", response_model=DestinationInfoFull, summary="One destination")
async def get_destination(name: str, controls: DestinationControlsDep) -> DestinationInfoFull:
    return destination_info(await controls.state(name, with_flow=True))


@router.patch(
    "/{name}", response_model=DestinationInfoFull, summary="Change rates, pause, resume, flow rules"
)
async def patch_destination(
    name: str, controls: DestinationControlsDep, body: Annotated[DestinationPatch, Body()]
) -> DestinationInfoFull:
    """Rates apply at once across all workers; `paused: true` stops every new submit and poll
    (in-flight ones finish, nothing fails) until `paused: false`; `enabled: true` re-enables a
    destination disabled after failing too long. A rate given while paused is the one a resume
    restores. `flow` fields apply in every worker within a few seconds and outlive restarts;
    `null` puts a field's configured value back."""
    try:
        state = await controls.update(
            name,
            submit_rate=body.submit_rate,
            poll_rate=body.poll_rate,
            paused=body.paused,
            reason=body.reason,
            flow=None if body.flow is None else body.flow.changes(),
            enabled=body.enabled,
        )
    except ValidationError as err:
        raise validation_problem(err.errors(), ("body", "flow")) from None
    return destination_info(state)
