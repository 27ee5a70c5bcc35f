"""A destination's flow-control block: `[destinations.<name>.flow]` in the destinations file."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class FlowPolicy(BaseModel):
    """The flow-control rules of one destination (each rule's module says how exact it is)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    throttle_pause: bool = Field(
        default=True,
        description="A 429 (or 503) with `Retry-After` pauses the destination's submit queue on"
        " the server until then, for every worker (`flowcontrol/throttle.py`); off: only the"
        " item that met it waits.",
    )
    throttle_max_pause_s: float = Field(
        default=300.0,
        gt=0,
        le=86_400,
        description="The longest pause one `Retry-After` causes; a longer one pauses this long.",
    )
    throttle_storm_window_s: float = Field(
        default=30.0,
        ge=0,
        le=86_400,
        description="A throttle this soon after a resume is the storm coming back: the submit"
        " rate resumes at half (down to 1/16).",
    )
    throttle_ramp_step_s: float = Field(
        default=2.0,
        gt=0,
        le=3_600,
        description="After a storm came back, the submit rate doubles every this many seconds"
        " without a throttle, until it is whole.",
    )
