"""Destinations: where items go, how fast, and how hard to try. Loaded from TOML plus env overrides.

File format (`config/destinations.toml`)::

    [destinations.fake-email]
    provider = "acs-email"
    submit_rate = 1.5          # submit activities per second, enforced by the Temporal server
    poll_rate = 2.0            # poll activities per second
    events_secret = "${FAKE_EMAIL_EVENTS_SECRET}"  # delivery reports authenticate with it
    max_attempts = 8           # any `DeliveryPolicy` field; its default and bounds apply
    [destinations.fake-email.settings]
    endpoint = "${FAKE_PROVIDER_URL}/acs"

String values may reference environment variables as `${NAME}` (or `${NAME:-default}`).
Any scalar field can be overridden by `DEST_<NAME>_<FIELD>`, the name upper-cased with `-` as
`_` (e.g. `DEST_FAKE_EMAIL_SUBMIT_RATE=3`), a provider setting by
`DEST_<NAME>_SETTINGS_<KEY>` (e.g. `DEST_FAKE_WEBHOOK_SETTINGS_SECRET=...`), and a flow-control
field by `DEST_<NAME>_FLOW_<FIELD>` (e.g. `DEST_FAKE_WEBHOOK_FLOW_THROTTLE_PAUSE=false`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tomllib
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    model_validator,
)

from durable_outbox_temporal.contract.bulk import DEFAULT_SHARDS, MAX_BATCH, MAX_SHARDS
from durable_outbox_temporal.contract.flow_policy import FlowPolicy, Quota
from durable_outbox_temporal.contract.ids import poll_task_queue, submit_task_queue
from durable_outbox_temporal.contract.item import (
    POLICY_SETTINGS,
    POLL_IN_SUBMIT_MAX_INTERVAL_S,
    DeliveryPolicy,
)
from durable_outbox_temporal.contract.lane import LanePolicy
from durable_outbox_temporal.contract.limits import (
    DEFAULT_MAX_RETRY_AFTER_S,
    MAX_DESTINATION_LENGTH,
    check_destination_name,
    check_outbox_name,
)

_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")

SettingsT = TypeVar("SettingsT", bound=BaseModel)

# Provider kind -> the model a destination's `settings` table must fit (the providers own them).
ProviderSettingsModels = Mapping[str, type[BaseModel]]


# Retention's defaults (docs/how-to/retention.md): a month of payloads (a dead letter can be
# redriven for that long), a year of item rows (reports, audits); the key memory for good.
DEFAULT_PAYLOAD_RETENTION_S = 30 * 24 * 3600.0
DEFAULT_ITEM_RETENTION_S = 365 * 24 * 3600.0

# A bulk destination's `report_window_s` unless set: a minute covers the reports that follow a
# send at once (ACS's come within seconds), and the shard lets its sent items go after it.
BULK_REPORT_WINDOW_S = 60.0


class DestinationConfigError(ValueError):
    """The destinations file or an override is invalid; the message says where and why."""


# The server splits a task queue's rate between the queue's partitions (4 by default), and each
# partition lets at least one activity through at once however low its share: a queue can burst
# that many activities. A batch's requests go out together, so four batches at once must fit in
# the one second's burst the rate allows. Why: docs/decisions/batch-size-quarter-of-the-rate.md
QUEUE_PARTITIONS = 4
BATCH_RULE = (
    f"the server's {QUEUE_PARTITIONS} partitions of a queue may each let a batch through at"
    f" once, so a batch may be at most 1/{QUEUE_PARTITIONS} of the rate"
)


# The slowest rate a destination may have: one request every ~17 minutes. Below it a rate is a
# typo (9.7e-39 would never deliver anything); to stop a destination, pause it.
MIN_RATE = 0.001


def poll_queue_requests(poll_rate: float, submit_rate: float, poll_in_submit: bool) -> float:
    """Polls a second the poll queue may make so that, with the first polls a `poll_in_submit`
    destination's submits make (at most `submit_rate` a second), the provider sees at most
    `poll_rate`."""
    return poll_rate - submit_rate if poll_in_submit else poll_rate


def _holds_to(quota: Quota, rate: float) -> bool:
    """Whether `quota` keeps requests within `rate` a second, at the scale of a second."""
    seconds = quota.window.total_seconds()
    return seconds <= 1 and quota.max <= rate * seconds * (1 + 1e-9)


def max_batch(rate: float) -> int:
    """The largest submit or poll batch a rate of `rate` requests a second allows."""
    return max(1, int(rate // QUEUE_PARTITIONS))


class Destination(BaseModel):
    """One destination: its provider and the provider's settings, rate limits, delivery policy."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: Annotated[
        str,
        AfterValidator(check_destination_name),
        Field(
            description="The table's name, `[destinations.<name>]`: lower-case letters, digits"
            f" and '-', starting with a letter or digit, at most {MAX_DESTINATION_LENGTH}"
            " characters."
        ),
    ]
    provider: str = Field(description="The provider kind; it decides what `settings` holds.")
    # As configured; `settings_as` checks them against the provider's settings model.
    settings: dict[str, Any] = Field(
        default_factory=dict,
        description="The provider's settings, the `[destinations.<name>.settings]` table.",
    )
    submit_rate: float = Field(
        default=1.5,
        ge=MIN_RATE,
        description="Submit activities per second, enforced by the Temporal server across every"
        f" worker; at least {MIN_RATE:g} (to stop a destination, pause it).",
    )
    poll_rate: float = Field(
        default=2.0,
        ge=MIN_RATE,
        description="Polls per second, likewise (with `poll_in_submit`, the submits' first polls"
        " included).",
    )
    # The secret the provider's report deliveries carry (`?secret=` or `X-Events-Secret`) to
    # `POST /v1/destinations/{name}/events`; unset: the destination takes no reports.
    events_secret: SecretStr | None = Field(
        default=None,
        min_length=16,
        description="The secret the provider's delivery reports carry to"
        " `POST /v1/destinations/{name}/events`; unset: the destination takes no reports.",
    )
    # Rotating `events_secret`: the provider's subscription and every API process cannot change
    # over at one instant, so the secret it replaces is still taken for a while.
    previous_events_secret: SecretStr | None = Field(
        default=None,
        min_length=16,
        description="While rotating `events_secret`: the secret it replaces, still taken until"
        " `previous_events_secret_until`, so reports sent with either are received while the"
        " provider's subscription changes over.",
    )
    previous_events_secret_until: AwareDatetime | None = Field(
        default=None,
        description="End of that grace window, an ISO 8601 time with its offset"
        " (`2026-12-01T12:00:00Z`); from then on only `events_secret` is taken. Required with"
        " `previous_events_secret`.",
    )
    # `item`: a workflow per item (its own history in the Web UI). `bulk`: the items are held by
    # `shards` long-lived shard workflows (volume, cost; see docs/how-to/bulk-mode.md).
    mode: Literal["item", "bulk"] = Field(
        default="item",
        description="`item`: a workflow per item; `bulk`: `shards` long-lived workflows hold the"
        " items.",
    )
    shards: int = Field(
        default=DEFAULT_SHARDS,
        ge=1,
        le=MAX_SHARDS,
        description="Bulk mode: how many shard workflows hold the destination's items. May"
        " change while they hold items: each ordering key and item keeps the count it was first"
        " handed over by (its route), new ones take this one.",
    )
    # Bulk mode: polls falling due together share one poll activity of up to this many. The
    # poll queue then runs `poll_rate / poll_batch` activities a second, so the provider still
    # sees at most `poll_rate` polls a second (and a lone poll waits its batch's turn).
    poll_batch: int = Field(
        default=1,
        ge=1,
        le=MAX_BATCH,
        description="Bulk mode: polls falling due together share one poll activity of up to"
        f" this many; at most 1/{QUEUE_PARTITIONS} of `poll_rate`.",
    )
    # Bulk mode: submits falling due together share one submit activity, likewise.
    submit_batch: int = Field(
        default=1,
        ge=1,
        le=MAX_BATCH,
        description="Bulk mode: submits falling due together share one submit activity of up to"
        f" this many; at most 1/{QUEUE_PARTITIONS} of `submit_rate`.",
    )

    # Item mode: an ordering lane's items go up to this many in one submit activity, one after
    # another. The queue counts activities, so a quota holds the requests to the rate instead
    # (`_lane_runs_are_held_to_the_rate`; docs/decisions/lanes-in-the-host.md).
    lane_run: int = Field(
        default=1,
        ge=1,
        le=MAX_BATCH,
        description="Item mode: an ordering lane sends up to this many of its items in one"
        " submit activity, one after another, each once the one before was delivered. Above 1"
        " it needs a quota of the destination with `per` at most 1 s and `max`/`per` at most"
        " `submit_rate` (the queue then counts runs, the quota requests). Bulk mode: see"
        " `submit_batch`.",
    )

    flow: FlowPolicy = Field(
        default_factory=FlowPolicy,
        description="Flow-control rules, the `[destinations.<name>.flow]` table (see below).",
    )

    # Retention counts from an item's end (`finished_at`): docs/how-to/retention.md.
    payload_retention_s: float | None = Field(
        default=None,
        gt=0,
        description="How long an ended item's payload and its attempts' headers and bodies are"
        " kept, in seconds after it ended; at least the destination's longest possible"
        " delivery. Unset: 30 days, or that longest delivery where it is longer.",
    )
    item_retention_s: float | None = Field(
        default=None,
        gt=0,
        description="How long an ended item's row, events and attempts are kept, in seconds"
        " after it ended; at least the payload's retention. Unset: 365 days, or the payload's"
        " retention where it is longer. Its key is remembered after: a repeat is still"
        " answered, never sent again.",
    )

    @property
    def payload_retention(self) -> float:
        """`payload_retention_s`, or its default (seconds)."""
        if self.payload_retention_s is not None:
            return self.payload_retention_s
        return max(DEFAULT_PAYLOAD_RETENTION_S, self.longest_delivery_s)

    @property
    def item_retention(self) -> float:
        """`item_retention_s`, or its default (seconds)."""
        if self.item_retention_s is not None:
            return self.item_retention_s
        return max(DEFAULT_ITEM_RETENTION_S, self.payload_retention)

    @property
    def longest_delivery_s(self) -> float:
        """How long an item here may take from its first submit to its workflow's end, the
        provider's longest `Retry-After` (`settings.max_retry_after_s`) included."""
        retry_after = self.settings.get("max_retry_after_s", DEFAULT_MAX_RETRY_AFTER_S)
        try:
            return self.delivery.longest_delivery_s(float(retry_after))
        except (TypeError, ValueError):
            # Not a number: the provider's settings model refuses it, naming the field.
            return self.delivery.longest_delivery_s(DEFAULT_MAX_RETRY_AFTER_S)

    @model_validator(mode="after")
    def _events_secret_rotation_is_complete(self) -> Destination:
        previous, until = self.previous_events_secret, self.previous_events_secret_until
        if (previous is None) != (until is None):
            raise ValueError("previous_events_secret and previous_events_secret_until go together")
        if previous is not None and self.events_secret is None:
            raise ValueError("previous_events_secret needs the events_secret that replaces it")
        if previous is not None and previous == self.events_secret:
            raise ValueError("previous_events_secret is the same as events_secret")
        return self

    def events_secrets(self, now: datetime) -> list[str]:
        """The secrets a delivery report may carry at `now`: `events_secret`, and the one it
        replaces until its grace window ends (none: the destination takes no reports)."""
        if self.events_secret is None:
            return []
        secrets = [self.events_secret.get_secret_value()]
        previous, until = self.previous_events_secret, self.previous_events_secret_until
        if previous is not None and until is not None and now < until:
            secrets.append(previous.get_secret_value())
        return secrets

    @model_validator(mode="after")
    def _retention_outlives_delivery(self) -> Destination:
        check_retention(self, self.payload_retention, self.item_retention)
        return self

    @model_validator(mode="after")
    def _batches_are_bulk_and_fit_the_rate(self) -> Destination:
        for kind, batch, rate in (
            ("poll", self.poll_batch, self.poll_rate),
            ("submit", self.submit_batch, self.submit_rate),
        ):
            if batch > 1 and not self.is_bulk:
                raise ValueError(
                    f"{kind}_batch: only a destination in bulk mode batches its {kind}s"
                )
            if batch > max_batch(rate):
                raise ValueError(
                    f"{kind}_batch {batch} is more than {kind}_rate {rate:g} allows ("
                    f"{max_batch(rate)}): {BATCH_RULE}"
                )
        return self

    @model_validator(mode="after")
    def _lane_runs_are_held_to_the_rate(self) -> Destination:
        """A run is one activity on the submit queue, however many requests it makes: only a
        quota (counted per request, across workers) keeps the provider within `submit_rate`."""
        if self.lane_run == 1:
            return self
        if self.is_bulk:
            raise ValueError(
                "lane_run: a bulk destination's lanes go in runs of up to submit_batch items;"
                " set submit_batch instead"
            )
        if not any(_holds_to(quota, self.submit_rate) for quota in self.flow.quotas):
            most = max(1, math.floor(self.submit_rate))
            raise ValueError(
                f"lane_run {self.lane_run} needs a quota that holds the destination's requests"
                f" to submit_rate {self.submit_rate:g} (its submit queue counts a run of items as"
                " one activity): add one with per at most 1 s and max/per at most submit_rate,"
                f' e.g. [destinations.{self.name}.flow] quotas = [{{ per = "1s", max = {most} }}],'
                " or set lane_run = 1"
            )
        return self

    @model_validator(mode="after")
    def _adaptive_fits(self) -> Destination:
        """An adaptive rate moves between its floor and ceiling in requests a second, which is
        the submit queue's rate only while each submit activity is one request."""
        if not self.flow.adaptive:
            return self
        self.flow.adaptive_bounds(self.submit_rate)
        if self.submit_batch > 1 or self.lane_run > 1:
            raise ValueError(
                "flow.adaptive: not with submit_batch or lane_run above 1 (an activity there"
                " carries many requests, and the adaptive rate counts requests)"
            )
        return self

    @model_validator(mode="after")
    def _poll_in_submit_fits(self) -> Destination:
        if not self.delivery.poll_in_submit:
            return self
        if self.is_bulk:
            raise ValueError(
                "poll_in_submit: only a destination in item mode polls in its submits (bulk"
                " shards share their polls instead: poll_batch)"
            )
        if self.poll_rate <= self.submit_rate:
            raise ValueError(
                f"poll_in_submit needs poll_rate above submit_rate ({self.poll_rate:g} <="
                f" {self.submit_rate:g}): each submit may make a poll too, so the poll queue"
                " runs poll_rate - submit_rate"
            )
        if self.delivery.poll_interval_s > POLL_IN_SUBMIT_MAX_INTERVAL_S:
            raise ValueError(
                f"poll_in_submit needs poll_interval_s of at most"
                f" {POLL_IN_SUBMIT_MAX_INTERVAL_S:g} (it is {self.delivery.poll_interval_s:g}):"
                " the submit activity waits that long before its poll"
            )
        return self

    @property
    def is_bulk(self) -> bool:
        """Whether shard workflows hold the destination's items (`mode = "bulk"`)."""
        return self.mode == "bulk"

    @property
    def poll_in_submit(self) -> bool:
        """Whether the submit activity makes each operation's first poll (see `DeliveryPolicy`)."""
        return self.delivery.poll_in_submit

    @property
    def poll_queue_rate(self) -> float:
        """The poll queue's rate in activities a second (see `poll_batch`): with
        `poll_in_submit`, what the first polls (one per submit at most) leave of `poll_rate`."""
        return poll_queue_requests(self.poll_rate, self.submit_rate, self.poll_in_submit) / (
            self.poll_batch
        )

    @property
    def submit_queue_rate(self) -> float:
        """The submit queue's rate in activities a second (see `submit_batch`)."""
        return self.submit_rate / self.submit_batch

    # Configured as flat fields (`max_attempts = 8`) and gathered here by `_gather_policy`, so
    # DeliveryPolicy's own defaults and bounds apply without being repeated.
    delivery: DeliveryPolicy = Field(
        description="The delivery policy, gathered from the table's policy fields."
    )

    @model_validator(mode="before")
    @classmethod
    def _gather_policy(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        if "delivery" in data:
            raise ValueError("delivery: unknown field (set the policy fields directly)")
        fields = dict(data)
        name = str(fields.get("name", ""))
        policy = {key: fields.pop(key) for key in POLICY_SETTINGS if key in fields}
        if "report_window_s" not in policy and fields.get("events_secret") is None:
            # No report can reach a destination without a secret through the API: its sent
            # items would each stay open (in bulk mode, held by a shard) for the default
            # window, waiting for nothing. Set explicitly, a window is kept (reports may come
            # through `OutboxClient.report_delivery`).
            policy["report_window_s"] = 0.0
        elif "report_window_s" not in policy and fields.get("mode") == "bulk":
            # A shard holds each sent item for its window, carrying it across every
            # continue-as-new; a report after the window goes to the item's read-model row
            # (`readmodel/delivery_reports.py`), so a short one loses nothing.
            policy["report_window_s"] = BULK_REPORT_WINDOW_S
        fields["delivery"] = {
            "destination": name,
            "submit_task_queue": submit_task_queue(name),
            "poll_task_queue": poll_task_queue(name),
            **policy,
        }
        return fields

    @property
    def submit_task_queue(self) -> str:
        return self.delivery.submit_task_queue

    @property
    def poll_task_queue(self) -> str:
        return self.delivery.poll_task_queue

    @property
    def max_attempts(self) -> int:
        return self.delivery.max_attempts

    def policy(self, max_attempts: int | None = None) -> DeliveryPolicy:
        """The snapshot a new item's workflow carries; `max_attempts` may only lower the limit."""
        limit = self.delivery.max_attempts
        attempts = limit if max_attempts is None else min(max_attempts, limit)
        # A copy, so no workflow input shares the destination's object.
        return dataclasses.replace(self.delivery, max_attempts=attempts)

    def settings_as(self, model: type[SettingsT]) -> SettingsT:
        """`settings` validated by `model`; raises DestinationConfigError naming each field."""
        try:
            return model.model_validate(self.settings)
        except ValidationError as err:
            problems = _describe(err, prefix="settings.")
            raise DestinationConfigError(f"destination {self.name!r}: {problems}") from err


class OutboxSettings(BaseModel):
    """Per-outbox settings (`[outboxes.<name>]`); an outbox not listed gets the defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    # What an ordering lane does when one of its items fails permanently: stop until an
    # operator redrives or skips it (`halt`), or record it and go on (`skip`).
    lane_policy: LanePolicy = Field(
        default=LanePolicy.HALT,
        description="What a lane does when one of its items fails permanently: stop until an"
        " operator redrives or skips it (`halt`), or record it and go on (`skip`).",
    )
    # Retention for this outbox's items, whatever their destination (None: the destination's).
    payload_retention_s: float | None = Field(
        default=None,
        gt=0,
        description="How long this outbox's ended items keep their payloads and attempt bodies,"
        " in seconds, in place of each destination's `payload_retention_s`; at least the"
        " longest possible delivery of every destination.",
    )
    item_retention_s: float | None = Field(
        default=None,
        gt=0,
        description="How long this outbox's ended items' rows are kept, in seconds, in place of"
        " each destination's `item_retention_s`.",
    )
    # A lane continues as new past this many history events (Temporal may ask sooner).
    lane_history_events: int = Field(
        default=10_000,
        ge=100,
        le=40_000,
        description="A lane continues as new past this many history events (Temporal may ask"
        " sooner).",
    )
    # How long a lane with nothing to do stays open before it ends (the next append restarts it).
    lane_idle_s: float = Field(
        default=300.0,
        gt=0,
        le=30 * 24 * 3600,
        description="How long a lane with nothing to do stays open before it ends, in seconds"
        " (the next append restarts it).",
    )


class RetentionTooShort(ValueError):
    """A retention shorter than the longest delivery it must outlive."""


def check_retention(destination: Destination, payload_s: float, item_s: float) -> None:
    """Refuse a payload retention shorter than the destination's longest possible delivery,
    or an item retention shorter than the payload's, naming why."""
    policy = destination.delivery
    longest = destination.longest_delivery_s
    if payload_s < longest:
        raise RetentionTooShort(
            f"payload_retention_s {payload_s:g} s is shorter than destination"
            f" {destination.name!r}'s longest possible delivery, {longest:g} s"
            f" ({policy.max_attempts} attempts of up to {policy.submit_timeout_s:g} s, each retry"
            f" waiting up to its backoff or the provider's max_retry_after_s, poll_deadline_s"
            f" {policy.poll_deadline_s:g} s, report_window_s {policy.report_window_s:g} s):"
            " an item still under way there would lose its payload"
        )
    if item_s < payload_s:
        raise RetentionTooShort(
            f"item_retention_s {item_s:g} s is shorter than payload_retention_s {payload_s:g} s:"
            " an item's row goes with its payload, so keep it at least as long"
        )


# An outbox with no `[outboxes.<name>]` table: built once (validating one costs more than the
# lookup that asks for it, on every append).
_DEFAULT_OUTBOX = OutboxSettings()


class DestinationRegistry:
    """The loaded destinations, by name, and the per-outbox settings."""

    def __init__(
        self,
        destinations: Mapping[str, Destination],
        outboxes: Mapping[str, OutboxSettings] | None = None,
    ) -> None:
        self._destinations = dict(destinations)
        self._outboxes = dict(outboxes or {})

    def outbox(self, name: str) -> OutboxSettings:
        """The outbox's settings (the defaults unless `[outboxes.<name>]` sets them)."""
        return self._outboxes.get(name) or _DEFAULT_OUTBOX

    def __contains__(self, name: object) -> bool:
        return name in self._destinations

    def __iter__(self) -> Iterator[Destination]:
        return iter(self._destinations.values())

    def __len__(self) -> int:
        return len(self._destinations)

    def get(self, name: str) -> Destination | None:
        return self._destinations.get(name)

    def bulk(self, name: str | None) -> Destination | None:
        """`name`'s destination if shards hold its items (bulk mode); None for one in item mode,
        an unknown one or none. The one place a destination's mode is asked outside it."""
        target = self._destinations.get(name) if name else None
        return target if target is not None and target.is_bulk else None

    def bulk_destinations(self) -> list[Destination]:
        """The destinations in bulk mode, in the order they were configured."""
        return [d for d in self._destinations.values() if self.bulk(d.name) is not None]

    @property
    def names(self) -> list[str]:
        return sorted(self._destinations)

    def retention(self, outbox: str | None, destination: Destination) -> tuple[float, float]:
        """The payload and item retention of `outbox`'s items at `destination`, in seconds (None:
        an outbox without overrides)."""
        settings = self.outbox(outbox) if outbox is not None else _DEFAULT_OUTBOX
        return (
            settings.payload_retention_s or destination.payload_retention,
            settings.item_retention_s or destination.item_retention,
        )

    def overridden_outboxes(self) -> list[str]:
        """The outboxes that set a retention of their own, by name."""
        return sorted(
            name
            for name, settings in self._outboxes.items()
            if settings.payload_retention_s is not None or settings.item_retention_s is not None
        )

    def check_retention(self) -> None:
        """Refuse an outbox's retention that some destination's delivery would outlive
        (`RetentionTooShort`, naming the outbox and why)."""
        for outbox in self.overridden_outboxes():
            for destination in self:
                payload_s, item_s = self.retention(outbox, destination)
                try:
                    check_retention(destination, payload_s, item_s)
                except RetentionTooShort as err:
                    raise DestinationConfigError(f"outbox {outbox!r}: {err}") from err

    @classmethod
    def from_file(
        cls,
        path: Path,
        environ: Mapping[str, str] | None = None,
        *,
        provider_settings: ProviderSettingsModels | None,
    ) -> DestinationRegistry:
        """Load `path`, expand `${ENV}` references, apply `DEST_*` overrides and validate.

        `provider_settings` checks each destination's settings by its provider kind; only a
        process that never builds providers passes None.
        """
        try:
            raw = tomllib.loads(path.read_text())
        except FileNotFoundError as err:
            raise DestinationConfigError(f"destinations file not found: {path}") from err
        except tomllib.TOMLDecodeError as err:
            raise DestinationConfigError(f"{path}: invalid TOML: {err}") from err
        registry = cls.from_mapping(
            raw.get("destinations", {}),
            environ,
            source=str(path),
            provider_settings=provider_settings,
        )
        registry._outboxes = _load_outboxes(raw.get("outboxes", {}), str(path))
        try:
            registry.check_retention()
        except DestinationConfigError as err:
            raise DestinationConfigError(f"{path}: {err}") from err
        return registry

    @classmethod
    def from_mapping(
        cls,
        raw: Mapping[str, Any],
        environ: Mapping[str, str] | None = None,
        source: str = "<config>",
        *,
        provider_settings: ProviderSettingsModels | None,
    ) -> DestinationRegistry:
        """Like `from_file`, from the parsed `destinations` table."""
        environ = os.environ if environ is None else environ
        destinations: dict[str, Destination] = {}
        for name, fields in raw.items():
            try:
                destinations[name] = _load(name, fields, environ, provider_settings)
            except DestinationConfigError as err:
                raise DestinationConfigError(f"{source}: {err}") from err
        return cls(destinations)


def _load_outboxes(raw: Any, source: str) -> dict[str, OutboxSettings]:
    if not isinstance(raw, Mapping):
        raise DestinationConfigError(f"{source}: outboxes: must be a table")
    outboxes: dict[str, OutboxSettings] = {}
    for name, fields in raw.items():
        where = f"{source}: outbox {name!r}"
        try:
            check_outbox_name(name)
            outboxes[name] = OutboxSettings.model_validate(fields)
        except ValueError as err:
            problem = _describe(err) if isinstance(err, ValidationError) else str(err)
            raise DestinationConfigError(f"{where}: {problem}") from err
    return outboxes


def _load(
    name: str,
    fields: Any,
    environ: Mapping[str, str],
    provider_settings: ProviderSettingsModels | None,
) -> Destination:
    where = f"destination {name!r}"
    if not isinstance(fields, Mapping):
        raise DestinationConfigError(f"{where}: must be a table")
    try:
        merged = _apply_overrides(name, _expand_env(dict(fields), environ), environ)
        destination = Destination.model_validate({"name": name, **merged})
    except ValidationError as err:
        raise DestinationConfigError(f"{where}: {_describe(err)}") from err
    except DestinationConfigError as err:
        raise DestinationConfigError(f"{where}: {err}") from err
    if provider_settings is not None:
        model = provider_settings.get(destination.provider)
        if model is None:
            known = ", ".join(sorted(provider_settings))
            raise DestinationConfigError(
                f"{where}: provider: unknown provider {destination.provider!r} (known: {known})"
            )
        destination.settings_as(model)
    return destination


def _describe(err: ValidationError, prefix: str = "") -> str:
    """Each problem as `field: what is wrong`, in the file's flat field names."""
    problems = []
    for error in err.errors():
        location = list(error["loc"])
        # Policy fields sit flat in the file; `delivery` is only where the model gathers them.
        if location[:1] == ["delivery"]:
            location = location[1:]
        field = prefix + ".".join(str(part) for part in location)
        if error["type"] == "value_error":
            message = str(error["ctx"]["error"])
        elif error["type"] == "extra_forbidden":
            message = "unknown field"
        else:
            message = error["msg"]
        problems.append(f"{field}: {message}" if location else message)
    return "; ".join(problems)


def _expand_env(value: Any, environ: Mapping[str, str]) -> Any:
    if isinstance(value, str):

        def substitute(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            # As the shell's `${X:-default}`: an empty variable takes the default too.
            if environ.get(name):
                return environ[name]
            if default is not None:
                return default
            if name in environ:
                return environ[name]
            raise DestinationConfigError(f"environment variable {name} is not set")

        return _ENV_REFERENCE.sub(substitute, value)
    if isinstance(value, dict):
        return {key: _expand_env(item, environ) for key, item in value.items()}
    if isinstance(value, list):
        return [_expand_env(item, environ) for item in value]
    return value


def _apply_overrides(
    name: str, fields: dict[str, Any], environ: Mapping[str, str]
) -> dict[str, Any]:
    prefix = f"DEST_{name.upper().replace('-', '_')}_"
    tables = {"settings": dict(fields.get("settings", {})), "flow": dict(fields.get("flow", {}))}
    for env_name, env_value in environ.items():
        if not env_name.startswith(prefix):
            continue
        field = env_name[len(prefix) :].lower()
        table, _, key = field.partition("_")
        if table in tables and key:
            tables[table][key] = env_value
        else:
            # Pydantic coerces the string to the field's type and reports bad values by name.
            fields[field] = env_value
    fields["settings"] = tables["settings"]
    if tables["flow"]:
        fields["flow"] = tables["flow"]
    return fields
