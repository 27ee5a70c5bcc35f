"""Scheduled fan-out: Temporal Schedules that enqueue a templated batch of items on a cron or an
interval; the operations-worker activity that does the enqueueing for each fire is
`activities/schedules.py`.

Create, list, show, pause, unpause, trigger and delete go straight to Temporal's schedule API;
the template travels as the schedule action's argument and a summary of the spec in its memo,
so Temporal holds the whole schedule and nothing here needs a table.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

from durable_outbox_temporal import (
    InvalidRequest,
    OutboxClient,
    OutboxError,
)
from durable_outbox_temporal.client import RPC_TIMEOUT
from durable_outbox_temporal.contract import limits, provider_payloads
from durable_outbox_temporal.contract.ids import scheduled_batch_workflow_id, temporal_schedule_id
from durable_outbox_temporal.contract.schedule import (
    DEFAULT_CATCHUP_WINDOW_S,
    MAX_CATCHUP_WINDOW_S,
    MAX_INTERVAL_S,
    MAX_SCHEDULE_ITEMS,
    MIN_CATCHUP_WINDOW_S,
    PLACEHOLDERS,
    SCHEDULED_BATCH_WORKFLOW_TYPE,
    ItemTemplate,
    Overlap,
    ScheduledBatchInput,
    check_key_suffix,
    check_schedule_id,
    fire_values,
    item_key,
    render,
    unknown_placeholders,
)
from durable_outbox_temporal.fan_out import fan_out
from durable_outbox_temporal.validation import validate_json_depth, validate_json_values
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionExecutionStartWorkflow,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleDescription,
    ScheduleHandle,
    ScheduleIntervalSpec,
    ScheduleListActionStartWorkflow,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
)
from temporalio.service import RPCError, RPCStatusCode

# The schedule's memo entry: the spec as it was asked for (Temporal keeps a cron expression only
# compiled into calendars) and what the template enqueues.
MEMO_KEY = "scheduled_fan_out"
MAX_NOTE_LENGTH = 500
_OVERLAP = {
    Overlap.SKIP: ScheduleOverlapPolicy.SKIP,
    Overlap.BUFFER_ONE: ScheduleOverlapPolicy.BUFFER_ONE,
}
# Upcoming fire times a schedule view lists.
NEXT_FIRES_SHOWN = 5

T = TypeVar("T")


class ScheduleNotFound(OutboxError):
    """No scheduled fan-out with that id exists."""


class ScheduleExists(OutboxError):
    """A scheduled fan-out with that id exists already."""


class InvalidSchedule(OutboxError):
    """The schedule's spec or template is invalid; `errors` names each field and what is wrong."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{location}: {message}" for location, message in errors))
        self.errors = errors


@dataclass
class NewSchedule:
    """A scheduled fan-out as a caller describes it: exactly one of `cron`, `interval_seconds`."""

    id: str
    outbox: str
    items: list[ItemTemplate]
    cron: str | None = None
    interval_seconds: int | None = None
    timezone: str | None = None
    paused: bool = False
    note: str | None = None
    overlap: Overlap = Overlap.SKIP
    catchup_window_seconds: int = DEFAULT_CATCHUP_WINDOW_S


@dataclass
class Fire:
    """One recent fire: when it was due, when it started, its workflow and that one's status."""

    scheduled_at: datetime
    started_at: datetime
    workflow_id: str
    # running, completed, failed, ...; None once Temporal no longer has the workflow.
    status: str | None = None


@dataclass
class ScheduleSummary:
    """A scheduled fan-out as a list shows it."""

    id: str
    outbox: str | None
    cron: str | None
    interval_seconds: int | None
    timezone: str | None
    items: int | None
    paused: bool
    note: str
    next_fire_times: list[datetime]
    last_fired_at: datetime | None


@dataclass(kw_only=True)
class ScheduleDetail(ScheduleSummary):
    """One scheduled fan-out in full: template, policies, counters and recent fires."""

    temporal_schedule_id: str
    template: list[ItemTemplate]
    overlap: Overlap | None
    catchup_window_seconds: float | None
    fires: int
    missed_catchup_window: int
    skipped_overlap: int
    recent_fires: list[Fire] = field(default_factory=list)
    running: list[str] = field(default_factory=list)
    created_at: datetime
    updated_at: datetime | None


class ScheduleService:
    """Scheduled fan-out over one `OutboxClient` (its destinations validate the template, its
    task queue runs the `ScheduledBatch` workflows) and the operations worker's task queue."""

    def __init__(self, client: OutboxClient, operations_task_queue: str) -> None:
        self.client = client
        self.operations_task_queue = operations_task_queue

    async def create(self, new: NewSchedule) -> ScheduleDetail:
        """Create the schedule; `InvalidSchedule` (naming each bad field) or `ScheduleExists`."""
        self.validate(new)
        batch = ScheduledBatchInput(
            schedule_id=new.id,
            outbox=new.outbox,
            items=new.items,
            operations_task_queue=self.operations_task_queue,
            timezone=new.timezone,
        )
        schedule = Schedule(
            action=ScheduleActionStartWorkflow(
                SCHEDULED_BATCH_WORKFLOW_TYPE,
                batch,
                id=scheduled_batch_workflow_id(new.id),
                task_queue=self.client.task_queue,
                static_summary=f"Enqueue {len(new.items)} item(s) into outbox {new.outbox}",
            ),
            spec=ScheduleSpec(
                cron_expressions=[new.cron] if new.cron is not None else [],
                intervals=[ScheduleIntervalSpec(every=timedelta(seconds=new.interval_seconds))]
                if new.interval_seconds is not None
                else [],
                time_zone_name=new.timezone,
            ),
            policy=SchedulePolicy(
                overlap=_OVERLAP[new.overlap],
                catchup_window=timedelta(seconds=new.catchup_window_seconds),
            ),
            state=ScheduleState(paused=new.paused, note=new.note or ""),
        )
        memo = {
            "outbox": new.outbox,
            "cron": new.cron,
            "interval_seconds": new.interval_seconds,
            "timezone": new.timezone,
            "items": len(new.items),
        }
        client = await self.client.temporal()
        try:
            await client.create_schedule(
                temporal_schedule_id(new.id),
                schedule,
                memo={MEMO_KEY: memo},
                rpc_timeout=RPC_TIMEOUT,
            )
        except ScheduleAlreadyRunningError as err:
            raise ScheduleExists(f"a schedule with id {new.id!r} exists already") from err
        except RPCError as err:
            if err.status != RPCStatusCode.INVALID_ARGUMENT:
                raise
            # The server parses the cron expression and the time zone: its answer is the check.
            raise InvalidSchedule([(_spec_field(new, err.message), err.message)]) from err
        return await self.get(new.id)

    def validate(self, new: NewSchedule) -> None:
        """Every rule a batch enqueue applies to these items, checked once at creation so that
        no fire can fail on them; raises `InvalidSchedule` listing every bad field."""
        errors: list[tuple[str, str]] = []

        def check(location: str, rule: Callable[[], object]) -> None:
            try:
                rule()
            except ValueError as err:
                errors.append((location, str(err)))

        check("id", lambda: check_schedule_id(new.id))
        check("outbox", lambda: limits.check_outbox_name(new.outbox))
        if (new.cron is None) == (new.interval_seconds is None):
            errors.append(("cron", "give exactly one of cron and interval_seconds"))
        if new.interval_seconds is not None and not 1 <= new.interval_seconds <= MAX_INTERVAL_S:
            errors.append(("interval_seconds", f"must be 1 to {MAX_INTERVAL_S} seconds"))
        if new.timezone is not None:
            check("timezone", lambda: _check_timezone(new.timezone or ""))
        if not MIN_CATCHUP_WINDOW_S <= new.catchup_window_seconds <= MAX_CATCHUP_WINDOW_S:
            errors.append(
                (
                    "catchup_window_seconds",
                    f"must be {MIN_CATCHUP_WINDOW_S} to {MAX_CATCHUP_WINDOW_S} seconds",
                )
            )
        if new.note is not None and len(new.note) > MAX_NOTE_LENGTH:
            errors.append(("note", f"must be at most {MAX_NOTE_LENGTH} characters"))
        if not 1 <= len(new.items) <= MAX_SCHEDULE_ITEMS:
            errors.append(("items", f"give 1 to {MAX_SCHEDULE_ITEMS} items"))
        suffixes: set[str] = set()
        for index, item in enumerate(new.items):
            errors.extend(self._item_errors(new.id, index, item))
            suffix = item.suffix(index)
            if suffix in suffixes:
                errors.append(
                    (
                        f"items.{index}.key_suffix",
                        f"two items would share the key suffix {suffix!r}",
                    )
                )
            suffixes.add(suffix)
        if errors:
            raise InvalidSchedule(errors)

    def _item_errors(
        self, schedule_id: str, index: int, item: ItemTemplate
    ) -> list[tuple[str, str]]:
        at = f"items.{index}"
        errors: list[tuple[str, str]] = []
        if self.client.destinations.get(item.destination) is None:
            known = ", ".join(self.client.destinations.names) or "none"
            errors.append(
                (
                    f"{at}.destination",
                    f"unknown destination {item.destination!r} (configured: {known})",
                )
            )
        if item.key_suffix is not None:
            try:
                check_key_suffix(item.key_suffix)
            except ValueError as err:
                errors.append((f"{at}.key_suffix", str(err)))
        if item.ordering_key is not None:
            try:
                limits.check_ordering_key(item.ordering_key)
            except ValueError as err:
                errors.append((f"{at}.ordering_key", str(err)))
        if item.max_attempts is not None and item.max_attempts < 1:
            errors.append((f"{at}.max_attempts", "must be at least 1"))
        try:
            validate_json_depth(item.payload)
            # A value no JSON body carries (a lone surrogate, NaN): every fire would fail.
            validate_json_values(item.payload)
        except InvalidRequest as err:
            # The placeholder walk below recurses: a payload this deep is refused before it.
            errors.append((f"{at}.payload", str(err)))
            return errors
        for path, name in unknown_placeholders(item.payload):
            location = ".".join(str(part) for part in [at, "payload", *path])
            known = ", ".join(PLACEHOLDERS)
            errors.append((location, f"unknown placeholder {{{{{name}}}}} (known: {known})"))
        if not errors:
            # The longest key this item can get must still be a valid key.
            sample_at = datetime(2000, 1, 1, tzinfo=UTC)
            sample = item_key(schedule_id, sample_at, item.suffix(index))
            try:
                limits.check_idempotency_key(sample)
            except ValueError as err:
                errors.append((f"{at}.key_suffix", f"the item's key {sample!r}: {err}"))
            target = self.client.destinations.get(item.destination)
            try:
                # What every fire would enqueue, as the destination's provider checks it.
                values = fire_values(schedule_id, sample_at, None, sample)
                if target is not None:
                    provider_payloads.check_payload_for(
                        target.provider, target.settings, render(item.payload, values)
                    )
            except ValueError as err:
                errors.append((f"{at}.payload", str(err)))
        return errors

    async def list(self) -> list[ScheduleSummary]:
        """Every scheduled fan-out of the namespace, by id (Temporal's list trails creation by
        a moment)."""
        client = await self.client.temporal()
        found: list[ScheduleSummary] = []
        async for entry in await client.list_schedules(rpc_timeout=RPC_TIMEOUT):
            schedule_id = _our_id(entry.id)
            action = entry.schedule.action if entry.schedule is not None else None
            if (
                schedule_id is None
                or not isinstance(action, ScheduleListActionStartWorkflow)
                or action.workflow != SCHEDULED_BATCH_WORKFLOW_TYPE
            ):
                continue  # another application's schedule in the same namespace
            memo = await entry.memo_value(MEMO_KEY, default={})
            state = entry.schedule.state if entry.schedule is not None else None
            recent = entry.info.recent_actions if entry.info is not None else []
            paused = state.paused if state is not None else False
            upcoming = entry.info.next_action_times if entry.info is not None else []
            found.append(
                ScheduleSummary(
                    id=schedule_id,
                    paused=paused,
                    note=state.note or "" if state is not None else "",
                    next_fire_times=_next_fires(upcoming, paused),
                    last_fired_at=recent[-1].scheduled_at if recent else None,
                    **_memo_fields(memo),
                )
            )
        return sorted(found, key=lambda summary: summary.id)

    async def get(self, schedule_id: str) -> ScheduleDetail:
        """The schedule in full, with the status of each recent fire's workflow."""
        handle = await self._handle(schedule_id)
        description = await _not_found_as(schedule_id, handle.describe(rpc_timeout=RPC_TIMEOUT))
        client = await self.client.temporal()
        template = await _template(client, description)
        memo = await description.memo_value(MEMO_KEY, default={})
        info, schedule = description.info, description.schedule
        fires = [
            Fire(
                scheduled_at=action.scheduled_at,
                started_at=action.started_at,
                workflow_id=action.action.workflow_id,
            )
            for action in reversed(info.recent_actions)
            if isinstance(action.action, ScheduleActionExecutionStartWorkflow)
        ]
        statuses = await fan_out(
            [functools.partial(_workflow_status, client, fire.workflow_id) for fire in fires]
        )
        for fire, status in zip(fires, statuses, strict=True):
            if isinstance(status, Exception):
                raise status
            fire.status = status
        policy = schedule.policy
        return ScheduleDetail(
            id=schedule_id,
            temporal_schedule_id=description.id,
            paused=schedule.state.paused,
            note=schedule.state.note or "",
            next_fire_times=_next_fires(info.next_action_times, schedule.state.paused),
            last_fired_at=fires[0].scheduled_at if fires else None,
            **_memo_fields(memo),
            template=template.items if template is not None else [],
            overlap=_overlap_of(policy.overlap),
            catchup_window_seconds=policy.catchup_window.total_seconds()
            if policy.catchup_window is not None
            else None,
            fires=info.num_actions,
            missed_catchup_window=info.num_actions_missed_catchup_window,
            skipped_overlap=info.num_actions_skipped_overlap,
            recent_fires=fires,
            running=[
                action.workflow_id
                for action in info.running_actions
                if isinstance(action, ScheduleActionExecutionStartWorkflow)
            ],
            created_at=info.created_at,
            updated_at=info.last_updated_at,
        )

    async def pause(self, schedule_id: str, note: str | None = None) -> ScheduleDetail:
        """Stop firing until unpaused (a manual trigger still fires)."""
        handle = await self._handle(schedule_id)
        await _not_found_as(
            schedule_id,
            handle.pause(
                note=_checked_note(note) or "paused through the API", rpc_timeout=RPC_TIMEOUT
            ),
        )
        return await self.get(schedule_id)

    async def unpause(self, schedule_id: str, note: str | None = None) -> ScheduleDetail:
        """Fire again from the next fire time on (missed ones within the catch-up window too)."""
        handle = await self._handle(schedule_id)
        await _not_found_as(
            schedule_id,
            handle.unpause(
                note=_checked_note(note) or "unpaused through the API", rpc_timeout=RPC_TIMEOUT
            ),
        )
        return await self.get(schedule_id)

    async def trigger(self, schedule_id: str) -> None:
        """Fire now, paused or not, even while a fire is still running; the fire time is now,
        in whole seconds, so triggers within one second are one fire."""
        handle = await self._handle(schedule_id)
        await _not_found_as(
            schedule_id,
            handle.trigger(overlap=ScheduleOverlapPolicy.ALLOW_ALL, rpc_timeout=RPC_TIMEOUT),
        )

    async def delete(self, schedule_id: str) -> None:
        """Delete the schedule; fires already started finish, items already enqueued stay."""
        handle = await self._handle(schedule_id)
        await _not_found_as(schedule_id, handle.delete(rpc_timeout=RPC_TIMEOUT))

    async def _handle(self, schedule_id: str) -> ScheduleHandle:
        try:
            check_schedule_id(schedule_id)
        except ValueError as err:
            raise InvalidRequest(str(err)) from None
        client = await self.client.temporal()
        return client.get_schedule_handle(temporal_schedule_id(schedule_id))


def _check_timezone(name: str) -> None:
    try:
        ZoneInfo(name)
    except (ValueError, KeyError):
        raise ValueError(
            f"unknown time zone {name!r} (give an IANA name such as Europe/Paris)"
        ) from None


def _next_fires(upcoming: Sequence[datetime], paused: bool) -> list[datetime]:
    # Temporal lists the times a paused schedule would fire at; it fires at none of them.
    return [] if paused else list(upcoming[:NEXT_FIRES_SHOWN])


def _checked_note(note: str | None) -> str | None:
    if note is not None and len(note) > MAX_NOTE_LENGTH:
        raise InvalidRequest(f"note must be at most {MAX_NOTE_LENGTH} characters")
    return note


def _spec_field(new: NewSchedule, message: str) -> str:
    """Which request field the server's refusal of the spec is about."""
    if "time zone" in message.lower():
        return "timezone"
    return "cron" if new.cron is not None else "interval_seconds"


def _our_id(temporal_id: str) -> str | None:
    """The scheduled fan-out id behind a Temporal schedule id; None for anyone else's."""
    prefix = temporal_schedule_id("")
    if not temporal_id.startswith(prefix):
        return None
    return temporal_id[len(prefix) :]


def _memo_fields(memo: Any) -> dict[str, Any]:
    memo = memo if isinstance(memo, dict) else {}
    return {
        "outbox": memo.get("outbox"),
        "cron": memo.get("cron"),
        "interval_seconds": memo.get("interval_seconds"),
        "timezone": memo.get("timezone"),
        "items": memo.get("items"),
    }


def _overlap_of(policy: ScheduleOverlapPolicy) -> Overlap | None:
    for overlap, temporal_policy in _OVERLAP.items():
        if temporal_policy == policy:
            return overlap
    return None


async def _template(client: Client, description: ScheduleDescription) -> ScheduledBatchInput | None:
    """The schedule action's argument, decoded (None if the action is not ours)."""
    action = description.schedule.action
    if not isinstance(action, ScheduleActionStartWorkflow) or not action.args:
        return None
    decoded = await client.data_converter.decode(action.args, [ScheduledBatchInput])
    batch: ScheduledBatchInput = decoded[0]
    return batch


async def _workflow_status(client: Client, workflow_id: str) -> str | None:
    try:
        description = await client.get_workflow_handle(workflow_id).describe(
            rpc_timeout=RPC_TIMEOUT
        )
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    return description.status.name.lower() if description.status is not None else None


async def _not_found_as(schedule_id: str, call: Awaitable[T]) -> T:
    try:
        return await call
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise ScheduleNotFound(f"no schedule {schedule_id!r}") from err
        raise
