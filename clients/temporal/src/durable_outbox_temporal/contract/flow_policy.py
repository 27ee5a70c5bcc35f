"""A destination's flow-control block: `[destinations.<name>.flow]` in the destinations file."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

# A quota's window: a number of seconds, or a number and a unit (`1s`, `10m`, `1h`, `1d`).
_WINDOW = re.compile(r"^\s*(?P<n>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86_400, None: 1}
# The longest quota window: a day's requests are kept per scope (`readmodel.permits`).
MAX_WINDOW = timedelta(days=1)
# The shortest: below a second a quota is a rate (`rate`), and a window of nanoseconds would
# count nothing at all.
MIN_WINDOW = timedelta(milliseconds=1)


def window(value: str | float) -> timedelta:
    """A quota's `per`: seconds, or `1s`, `10m`, `1h`, `1d`; ValueError otherwise."""
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _WINDOW.match(value)
        if not match:
            raise ValueError(f"{value!r} is not a window: give seconds, or e.g. 1s, 10m, 1h, 1d")
        seconds = float(match["n"]) * _UNIT_S[match["unit"]]
    if not MIN_WINDOW.total_seconds() <= seconds <= MAX_WINDOW.total_seconds():
        raise ValueError(
            f"a quota's window must be at least {MIN_WINDOW.total_seconds():g} s and at most"
            f" {MAX_WINDOW}"
        )
    return timedelta(seconds=seconds)


class Quota(BaseModel):
    """At most `max` submits in any sliding window of `per`, across every worker."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    per: str | float = Field(
        description="The window: seconds, or `1s`, `10m`, `1h`, `1d` (from 1 ms to a day)."
    )
    max: int = Field(ge=1, le=10_000_000, description="Submits allowed in any such window.")

    @field_validator("per")
    @classmethod
    def _known_window(cls, value: str | float) -> str | float:
        window(value)
        return value

    @property
    def window(self) -> timedelta:
        return window(self.per)


class FlowPolicy(BaseModel):
    """The flow-control rules of one destination (each rule's module says how exact it is)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

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
    events_destination: str | None = Field(
        default=None,
        description="A configured destination (a webhook an operator's tooling listens on) that"
        " gets an item for each flow event: a throttle storm and its recovery, the circuit"
        " opening and closing (`activities/flow_events.py`); none: the API and dashboard only.",
    )
    breaker: bool = Field(
        default=True,
        description="Submits failing (5xx, timeouts, connection errors) above"
        " `breaker_failure_ratio` over `breaker_window_s` open the destination's circuit: its"
        " submit queue pauses, one probe goes every `breaker_probe_interval_s`, and it closes"
        " when probes succeed (`flowcontrol/breaker.py`); items wait, never fail, meanwhile.",
    )
    breaker_window_s: float = Field(
        default=30.0,
        gt=0,
        le=3_600,
        description="The sliding window over which each worker process counts submit outcomes.",
    )
    breaker_min_failures: int = Field(
        default=10,
        ge=1,
        le=100_000,
        description="Failed submits one worker process must see within the window to open the"
        " circuit, whatever the ratio.",
    )
    breaker_failure_ratio: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="The share of a process's submits within the window that must have failed"
        " to open the circuit.",
    )
    breaker_probe_interval_s: float = Field(
        default=15.0,
        ge=0.1,
        le=3_600,
        description="While the circuit is open, one probe request goes this often.",
    )
    breaker_close_after: int = Field(
        default=1,
        ge=1,
        le=100,
        description="Probes in a row that must succeed to close the circuit.",
    )
    disable_failing: bool = Field(
        default=True,
        description="A destination whose circuit stays open, or whose submits all fail, for"
        " `disable_after_s` is disabled: its submit queue stays paused (items wait, none is"
        ' lost) until an operator re-enables it with `PATCH {"enabled": true}`, and an event,'
        " a metric and an alert say so (`flowcontrol/disable.py`). It counts the breaker's"
        " failures: with `breaker = false`, nothing is disabled.",
    )
    disable_after_s: float = Field(
        default=259_200.0,
        ge=60,
        le=7_776_000,
        description="How long a destination fails before it is disabled (3 days; 1 minute to"
        " 90 days).",
    )
    adaptive: bool = Field(
        default=False,
        description="The submit rate learns the provider's limit (`flowcontrol/adaptive.py`):"
        " every `adaptive_interval_s` it rises by a fiftieth of the span between floor and"
        " ceiling while submits are answered within `adaptive_latency_target_s`, and falls to"
        " 0.9 of what the provider took on a 429, a 503, a timeout or a slower answer (once a"
        " congestion episode: the next two intervals' congestion is the fall's lag); held on"
        " the server for every worker. A `Retry-After` up to the interval is left to it; longer"
        " ones still pause the destination, and the breaker works beside it.",
    )
    adaptive_floor: float | None = Field(
        default=None,
        gt=0,
        le=100_000,
        description="The lowest submit rate the adaptive rate falls to (a second); none: a tenth"
        " of the ceiling.",
    )
    adaptive_ceiling: float | None = Field(
        default=None,
        gt=0,
        le=100_000,
        description="The highest submit rate it rises to (a second); none: the destination's"
        " `submit_rate`.",
    )
    adaptive_latency_target_s: float = Field(
        default=2.0,
        gt=0,
        le=300,
        description="A submit answered slower than this counts as a sign of overload.",
    )
    adaptive_interval_s: float = Field(
        default=2.0,
        ge=0.5,
        le=60,
        description="How often each worker reports its submits' outcomes and the rate moves.",
    )
    max_in_flight: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="The most submits and polls out at the provider at once for the destination,"
        " across every worker process (`flowcontrol/caps.py`); none: no cap beyond the rates.",
    )
    key_max_in_flight: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="The most submits and polls out at once for each `concurrency_key` (a"
        " tenant, a customer), across every worker process.",
    )
    quotas: list[Quota] = Field(
        default_factory=list,
        description="Submits allowed per sliding window, each never exceeded across workers:"
        ' e.g. `[{per = "1s", max = 10}, {per = "1h", max = 5000}]`.',
    )
    key_quotas: list[Quota] = Field(
        default_factory=list,
        description="The same, for each `concurrency_key` on its own (a rate per key).",
    )

    @field_validator("quotas", "key_quotas", mode="before")
    @classmethod
    def _quotas_from_text(cls, value: Any) -> Any:
        """An environment override gives JSON text: `[{"per": "1h", "max": 5000}]`."""
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError as err:
                raise ValueError(f"quotas must be a JSON list: {err}") from None
        return value

    @model_validator(mode="after")
    def _floor_under_ceiling(self) -> FlowPolicy:
        if (
            self.adaptive_floor is not None
            and self.adaptive_ceiling is not None
            and self.adaptive_floor > self.adaptive_ceiling
        ):
            raise ValueError(
                f"adaptive_floor ({self.adaptive_floor:g}) is above adaptive_ceiling"
                f" ({self.adaptive_ceiling:g})"
            )
        return self

    def adaptive_bounds(self, submit_rate: float) -> tuple[float, float]:
        """The adaptive rate's floor and ceiling for a destination configured at
        `submit_rate`; ValueError when the floor would be above the ceiling."""
        ceiling = self.adaptive_ceiling if self.adaptive_ceiling is not None else submit_rate
        floor = self.adaptive_floor if self.adaptive_floor is not None else ceiling / 10
        if floor > ceiling:
            raise ValueError(
                f"adaptive_floor ({floor:g}) is above the ceiling ({ceiling:g}: adaptive_ceiling,"
                " else submit_rate)"
            )
        return floor, ceiling

    @property
    def disabling_after_s(self) -> float | None:
        """How long the destination fails before it is disabled; None while the rule is off."""
        return self.disable_after_s if self.disable_failing else None

    def overridden(self, overrides: Mapping[str, Any]) -> FlowPolicy:
        """This policy with `overrides` (field -> value) in place, validated as the file's values
        are; raises pydantic's ValidationError naming each bad field."""
        return FlowPolicy.model_validate({**self.model_dump(), **overrides})


# The fields `PATCH /v1/destinations/{name}` may change at run time (`readmodel.flow_overrides`):
# every worker reads them again within seconds. The throttle's fields and `events_destination`
# are the destinations file's only: the flow workflow a throttle starts carries them.
RUN_TIME_FIELDS = (
    "breaker",
    "breaker_window_s",
    "breaker_min_failures",
    "breaker_failure_ratio",
    "breaker_probe_interval_s",
    "breaker_close_after",
    "disable_failing",
    "disable_after_s",
    "max_in_flight",
    "key_max_in_flight",
    "quotas",
    "key_quotas",
)


class StrictQuota(Quota):
    """A quota as a run-time change gives it: JSON of the right types only (`"5"` is no `max`)."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False)


class FlowPolicyChanges(BaseModel):
    """A run-time change of some of a destination's flow-control fields: each field given is set,
    `null` puts it back to the destinations file's value, one omitted stays as it is. Strict,
    unlike the file (whose environment overrides are text): `"3"` is no `max_in_flight`."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    def changes(self) -> dict[str, Any]:
        """The fields given, as JSON values (None: back to the file's)."""
        return self.model_dump(mode="json", include=self.model_fields_set)


def _changes_model() -> type[FlowPolicyChanges]:
    """`FlowPolicyChanges` with FlowPolicy's own run-time fields (types, bounds, descriptions),
    each optional: one definition of what a valid value is, for the file and the API alike."""
    fields: dict[str, Any] = {}
    for name in RUN_TIME_FIELDS:
        info = FlowPolicy.model_fields[name]
        kind: Any = list[StrictQuota] if info.annotation == list[Quota] else info.annotation
        if info.metadata:
            kind = Annotated[(kind, *info.metadata)]
        fields[name] = (kind | None, Field(default=None, description=info.description))
    return create_model("FlowPolicyPatch", __base__=FlowPolicyChanges, **fields)


if TYPE_CHECKING:
    # Type checkers see the base; pydantic builds the fields at import time.
    FlowPolicyPatch = FlowPolicyChanges
else:
    FlowPolicyPatch = _changes_model()
