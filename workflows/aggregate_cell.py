"""One aggregate's decisions and what they leave, apart from the workflow that hosts it.

`AggregateCell` holds an aggregate's state, version, views, dedupe window, rejected log, events
not yet stored and effect ledger, and runs a command on them: `decide` -> append -> `evolve`,
with no `await` in between (`apply`), so commands to one aggregate serialise. It does no I/O:
the workflow hosting it loads and stores it, runs its effects and hands it over
(`workflows/aggregate.py`). Its `now` is the workflow's (`workflow.now()`).
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from durable_outbox_temporal.aggregate_definition import (
        AggregateDefinition,
        Conflict,
        DomainError,
        Event,
        PlannedEffect,
        Timer,
        describe_invalid,
    )
    from durable_outbox_temporal.aggregate_definition import (
        InvalidCommand as DomainInvalidCommand,
    )
    from durable_outbox_temporal.contract.aggregate import (
        DEDUPE_WINDOW,
        DONE_EFFECTS_KEPT,
        REJECTED_LOG,
        SHREDDED,
        AggregateCarry,
        AggregateErrorType,
        AggregateView,
        CommandRequest,
        CommandResult,
        EffectRecord,
        EffectStatus,
        RecordedEvent,
        RejectedCommand,
        effect_counts,
    )
    from pydantic import ValidationError
    from pydantic_core import to_jsonable_python

# The bases a definition's own refusals derive from: raised as such, they name no reason.
_DOMAIN_BASES = (DomainError, Conflict, DomainInvalidCommand)
# The reason a command to an aggregate erased while it had no run is refused with.
ERASED_REASON = "AggregateErased"


class Refused(Exception):
    """A command refused before or by `decide`; becomes the update's ApplicationError, whose
    details carry the domain's `reason` (its error's class name) when it gave one."""

    def __init__(self, message: str, error_type: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.reason = reason

    def to_application_error(self) -> ApplicationError:
        details = [self.reason] if self.reason else []
        return ApplicationError(str(self), *details, type=self.error_type, non_retryable=True)


class AggregateCell:
    """One aggregate of a hosted type (`definition`; None for a type the worker does not host,
    whose run fails before any command reaches its cell)."""

    def __init__(
        self, aggregate_type: str, aggregate_id: str, definition: AggregateDefinition[Any] | None
    ) -> None:
        self.type, self.id = aggregate_type, aggregate_id
        self.definition = definition
        self.state: Any = None if definition is None else definition.initial_state()
        self.views: dict[str, Any] = (
            {} if definition is None else {n: p.initial() for n, p in definition.projectors.items()}
        )
        self.version = 0
        self.seen: dict[str, int] = {}
        self.seen_hashes: dict[str, str] = {}
        self.rejected: list[RejectedCommand] = []
        self.updated_at: datetime | None = None
        self.unstored: list[RecordedEvent] = []
        self.effects: dict[str, EffectRecord] = {}
        self.erased = False
        self.last_active = workflow.now()
        # Timers already fired at the current version: a timer whose command changed nothing
        # must not fire again in a loop.
        self.fired: set[tuple[datetime, str]] = set()
        self.fired_version = self.version

    def check(self, request: CommandRequest) -> list[Event]:
        """The events the command would cause now; raises `Refused` if it is refused."""
        definition = self.definition
        assert definition is not None
        if self.erased:
            raise Refused(
                f"{self.type} {self.id!r} was erased while idle: its state is gone, and it"
                " takes no more commands",
                AggregateErrorType.CONFLICT,
                ERASED_REASON,
            )
        if request.expected_version is not None and request.expected_version != self.version:
            raise Refused(
                f"expected version {request.expected_version}, the aggregate is at {self.version}",
                AggregateErrorType.CONFLICT,
                "VersionConflict",
            )
        try:
            command = definition.parse_command(request.name, request.payload)
        except KeyError:
            raise Refused(
                f"{self.type} has no command {request.name!r}", AggregateErrorType.UNKNOWN_COMMAND
            ) from None
        except ValidationError as err:
            raise Refused(describe_invalid(err), AggregateErrorType.INVALID) from None
        try:
            return definition.decide(self.state, command, workflow.now())
        except DomainError as err:
            kind = (
                AggregateErrorType.CONFLICT
                if isinstance(err, Conflict)
                else AggregateErrorType.INVALID
            )
            # A definition's own error class names the reason; the bases name none.
            reason = None if type(err) in _DOMAIN_BASES else type(err).__name__
            raise Refused(f"{type(err).__name__}: {err}", kind, reason) from None

    def repeated_version(self, request: CommandRequest) -> int | None:
        """The version a repeat of a remembered command id left the aggregate at; None for a
        new id. Refused when the id was used for another command or payload."""
        if request.command_id is None or request.command_id not in self.seen:
            return None
        remembered = self.seen_hashes.get(request.command_id)
        if remembered is not None and remembered != _command_hash(request):
            raise Refused(
                f"command id {request.command_id!r} is already used by another command or"
                " payload; use a new id for a new command",
                AggregateErrorType.IDEMPOTENCY_CONFLICT,
            )
        return self.seen[request.command_id]

    def apply(self, request: CommandRequest) -> CommandResult:
        definition = self.definition
        assert definition is not None
        self.touch()
        repeated = self.repeated_version(request)
        if repeated is not None:
            return CommandResult(events=[], version=repeated, duplicate=True)
        events = self.check(request)
        # Fold and plan on copies first: a policy that fails refuses the command whole, rather
        # than leaving half its events applied.
        state, views, planned = self.state, dict(self.views), []
        for seq, event in enumerate(events, start=self.version + 1):
            if type(event) not in definition.events:
                raise TypeError(f"{self.type}.decide returned an unregistered {event!r}")
            state = definition.evolve(state, event)
            for name, projector in definition.projectors.items():
                views[name] = projector.apply(views[name], event)
            planned += self.plan(seq, event, state)
        now = workflow.now()
        recorded = [
            RecordedEvent(
                seq=seq,
                type=type(event).__name__,
                data=event.model_dump(mode="json"),
                recorded_at=now,
                actor=request.actor,
                command_id=request.command_id,
            )
            for seq, event in enumerate(events, start=self.version + 1)
        ]
        self.state, self.views = state, views
        self.version += len(recorded)
        if recorded:
            self.updated_at = now
            self.unstored.extend(recorded)
        for effect in planned:
            self.add_effect(effect, now)
        if request.command_id is not None:
            self.seen[request.command_id] = self.version
            self.seen_hashes[request.command_id] = _command_hash(request)
            while len(self.seen) > DEDUPE_WINDOW:
                forgotten = next(iter(self.seen))
                del self.seen[forgotten]
                self.seen_hashes.pop(forgotten, None)
        return CommandResult(events=recorded, version=self.version)

    def plan(self, seq: int, event: Event, state: Any) -> list[PlannedEffect]:
        definition = self.definition
        assert definition is not None
        try:
            return definition.plan_effects(self.id, seq, event, state)
        except Exception as err:
            # A policy bug: refuse the command that triggered it, with the reason.
            raise Refused(
                f"the {type(event).__name__} policy failed: {type(err).__name__}: {err}",
                AggregateErrorType.INVALID,
            ) from None

    def add_effect(self, effect: PlannedEffect, now: datetime) -> None:
        """Into the ledger, unless its key is there already: a duplicate is ignored."""
        if effect.key in self.effects:
            return
        self.effects[effect.key] = EffectRecord(
            key=effect.key,
            event_seq=effect.event_seq,
            name=effect.name,
            kind=effect.kind,
            action=to_jsonable_python(effect.action_json()),
            created_at=now,
        )

    def reject(self, request: CommandRequest, refused: Refused) -> None:
        self.rejected.append(
            RejectedCommand(
                request=request,
                error_type=refused.error_type,
                message=str(refused),
                at=workflow.now(),
            )
        )
        del self.rejected[:-REJECTED_LOG]
        workflow.logger.warning("command %s refused: %s", request.name, refused)

    def next_timer(self) -> Timer | None:
        definition = self.definition
        if definition is None:
            return None
        if self.fired_version != self.version:
            self.fired, self.fired_version = set(), self.version
        pending = [
            timer
            for timer in definition.timers(self.state)
            if (timer.at, timer.command) not in self.fired
        ]
        return min(pending, key=lambda timer: timer.at, default=None)

    def forget_old_done_effects(self) -> None:
        done = [key for key, r in self.effects.items() if r.status == EffectStatus.DONE]
        for key in done[:-DONE_EFFECTS_KEPT]:
            del self.effects[key]

    def effect_counts(self) -> dict[str, int]:
        return effect_counts(list(self.effects.values()))

    # Passivation: an idle run stores its carry and ends; the next run loads it.

    def take(self, carry: AggregateCarry) -> None:
        """Start from what a run carried (across continue-as-new, or stored as it ended)."""
        definition = self.definition
        assert definition is not None
        self.state = definition.load_state(carry.state)
        self.views = dict(carry.views)
        self.version = carry.version
        self.seen = dict(carry.seen_commands)
        self.seen_hashes = dict(carry.seen_command_hashes)
        self.rejected = list(carry.rejected)
        self.updated_at = carry.updated_at
        self.unstored = list(carry.unstored)
        self.effects = {e.key: e for e in carry.effects}

    def carry(self) -> AggregateCarry:
        return AggregateCarry(
            state=self.state_json(),
            version=self.version,
            views=to_jsonable_python(self.views),
            seen_commands=dict(self.seen),
            seen_command_hashes=dict(self.seen_hashes),
            rejected=list(self.rejected),
            updated_at=self.updated_at,
            unstored=list(self.unstored),
            effects=list(self.effects.values()),
        )

    def state_json(self) -> dict[str, Any]:
        if self.erased:
            return dict(SHREDDED)
        if self.state is None:
            return {}
        state: dict[str, Any] = self.state.model_dump(mode="json")
        return state

    def view(self) -> AggregateView:
        return AggregateView(
            type=self.type,
            id=self.id,
            version=self.version,
            state=self.state_json(),
            views=to_jsonable_python(self.views),
            updated_at=self.updated_at,
            rejected=len(self.rejected),
            effects=self.effect_counts(),
        )

    def touch(self) -> None:
        self.last_active = workflow.now()

    def fire(self, timer: Timer) -> None:
        """Run a timer's command; a refused one goes to the rejected log."""
        self.fired.add((timer.at, timer.command))
        request = CommandRequest(
            name=timer.command,
            payload=to_jsonable_python(dict(timer.payload)),
            command_id=f"timer:{timer.command}:{timer.at.isoformat()}",
            actor="timer",
        )
        try:
            self.apply(request)
        except Refused as refused:
            self.reject(request, refused)


def _command_hash(request: CommandRequest) -> str:
    """What a command id stands for: the command's name and payload (but the fields its sender
    generates afresh on each try), as canonical JSON."""
    payload = {
        name: value
        for name, value in request.payload.items()
        if name not in request.generated_fields
    }
    canonical = json.dumps(
        [request.name, payload], sort_keys=True, separators=(",", ":"), default=str
    )
    # 128 bits tell payloads apart; the carry holds up to `DEDUPE_WINDOW` of them.
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]
