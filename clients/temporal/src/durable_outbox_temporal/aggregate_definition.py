"""What an aggregate definition is: plain Python, no Temporal, no I/O.

The base an aggregate type is written against, in its own package or in `examples/`: it imports
nothing of Temporal (an import-linter contract keeps it so), and the service registers a type by
configuration (`AGGREGATE_TYPES`, docs/how-to/add-an-aggregate-type.md).

A definition names its type, its commands (verbs, each a pydantic model of its payload), its
events (past tense) and its state, and gives three pure functions:

- `initial_state()` — the state before the first event;
- `decide(state, command, now)` — the events a command causes, or a `DomainError` to reject it;
  `now` is the command's time (the workflow's deterministic clock), for leases and deadlines;
- `evolve(state, event)` — the state after one event.

Optionally: `projectors` (per-aggregate read models folded from the events: sync projectors),
`timers(state)` (durable timers that become commands when they fire) and `policies` (per event
type, pure functions `policy(event, state) -> list[Effect]`: what should happen outside the
aggregate because of the event: the process manager, see docs/explanation/aggregates.md). The
generic aggregate workflow hosts any definition; tests call the functions directly.

Who may send what: `actor_field` names the payload field that says whom a command acts for (the
API lets a caller name only actors its token may act as, never a `RESERVED_ACTORS` one), and
state or event fields annotated `SECRET` are shown only to the actors `may_read_secrets` allows.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

StateT = TypeVar("StateT", bound=BaseModel)
ViewT = TypeVar("ViewT")

# Actors no caller may claim: the service's own. `policy` sends the commands effects issue,
# `timer` those durable timers fire, and `system` is what a policy's payload names when a
# definition reserves a command for the service (labour's `set_subscription_token`).
SYSTEM_ACTOR = "system"
RESERVED_ACTORS = frozenset({SYSTEM_ACTOR, "policy", "timer"})
# What a secret field shows to a reader not entitled to it.
REDACTED = "[redacted]"


class _Secret:
    """The marker of a secret field: `token: Annotated[str, SECRET]`."""

    def __repr__(self) -> str:
        return "SECRET"


SECRET = _Secret()


class Command(BaseModel):
    """Base of every command payload: unknown fields are refused, never ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Event(BaseModel):
    """Base of every event: immutable facts, named in the past tense."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class DomainError(Exception):
    """A command the aggregate refuses; subclasses name the reason (`SeatTaken`)."""


class Conflict(DomainError):
    """The command clashes with the current state (HTTP 409): it may succeed another time."""


class InvalidCommand(DomainError):
    """The command can never succeed as given (HTTP 422), e.g. a seat the flight does not have."""


@dataclass(frozen=True)
class Timer:
    """A durable timer a definition asks for: at `at`, command `command` with `payload` runs."""

    at: datetime
    command: str
    payload: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Projector(Generic[ViewT]):
    """A per-aggregate read model: folded from the events, kept in the workflow, queryable."""

    initial: Callable[[], ViewT]
    apply: Callable[[ViewT, Event], ViewT]


# Effects: what a policy asks for. Each has a stable `name`, unique among the effects of one
# event; with the aggregate and the event's sequence number it makes the effect's idempotency
# key, so a retried or replayed effect happens once. The same key is the outbox item's key, the
# issued command's id and the provider's idempotency key, so it follows the rules of an item key
# (no "/", at most MAX_EFFECT_KEY_LENGTH characters).


@dataclass(frozen=True)
class EnqueueItem:
    """Put an item in an outbox; the effect's key is the item's idempotency key."""

    outbox: str
    destination: str
    payload: Mapping[str, Any]
    ordering_key: str | None = None


@dataclass(frozen=True)
class IssueCommand:
    """Run a command on this aggregate (no target) or on `target_type`/`target_id`, once: the
    effect's key is its command id. `generated_tokens` names payload fields the executor fills
    with a fresh random token, the one input a pure policy cannot make itself; if a retry sends
    another token, the command id still lets only the first command count."""

    command: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    target_type: str | None = None
    target_id: str | None = None
    generated_tokens: tuple[str, ...] = ()


@dataclass(frozen=True)
class CallProvider:
    """Call a destination's provider directly, once (the effect's key is the provider's
    idempotency key), for a side effect whose answer the aggregate does not need."""

    destination: str
    payload: Mapping[str, Any]


EffectAction = EnqueueItem | IssueCommand | CallProvider
# How each action is named in the ledger and the API.
EFFECT_KINDS: dict[type[Any], str] = {
    EnqueueItem: "enqueue_item",
    IssueCommand: "issue_command",
    CallProvider: "call_provider",
}
# No ":" in names: the key's last ":" separates the name, so no two effects share a key.
EFFECT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,99}$"
MAX_EFFECT_KEY_LENGTH = 200
_EFFECT_NAME = re.compile(EFFECT_NAME_PATTERN)


@dataclass(frozen=True)
class Effect:
    name: str
    action: EffectAction


@dataclass(frozen=True)
class PlannedEffect:
    """An effect with its idempotency key: `{type}:{id}:{event seq}:{name}`."""

    key: str
    event_seq: int
    name: str
    action: EffectAction

    @property
    def kind(self) -> str:
        return EFFECT_KINDS[type(self.action)]

    def action_json(self) -> dict[str, Any]:
        """The action's fields as JSON, for the ledger and the executor."""
        fields = dataclasses.asdict(self.action)
        return {
            name: list(value) if isinstance(value, tuple) else value
            for name, value in fields.items()
        }


def parse_action(kind: str, data: Mapping[str, Any]) -> EffectAction:
    """The action a ledger entry holds, back from its JSON."""
    action_type = next(t for t, name in EFFECT_KINDS.items() if name == kind)
    fields = dict(data)
    if "generated_tokens" in fields:
        fields["generated_tokens"] = tuple(fields["generated_tokens"])
    action: EffectAction = action_type(**fields)
    return action


def effect_key(aggregate_type: str, aggregate_id: str, event_seq: int, name: str) -> str:
    """`{type}:{id}:{seq}:{name}`; one too long for an item key becomes `{type}:sha256-{hash
    of that}`, still one key per effect."""
    key = f"{aggregate_type}:{aggregate_id}:{event_seq}:{name}"
    if len(key) <= MAX_EFFECT_KEY_LENGTH:
        return key
    return f"{aggregate_type}:sha256-{hashlib.sha256(key.encode()).hexdigest()}"


class AggregateDefinition(Generic[StateT]):
    """Subclass per aggregate type; the class attributes describe it, the methods decide."""

    type_name: ClassVar[str]
    state_model: ClassVar[type[BaseModel]]
    # Command name (a verb, as the API spells it) -> its payload model.
    commands: ClassVar[Mapping[str, type[Command]]]
    # Every event class the definition emits; an event's type name is its class name.
    events: ClassVar[tuple[type[Event], ...]]
    projectors: ClassVar[Mapping[str, Projector[Any]]] = {}
    # Event type name -> policy(event, state after the event) -> effects. Pure: same event and
    # state, same effects, whenever and however often it runs.
    policies: ClassVar[Mapping[str, Callable[[Any, Any], list[Effect]]]] = {}
    # The payload field naming whom a command acts for (a user id), or None if commands name
    # nobody. The API checks it against the caller's token (docs/explanation/aggregates.md).
    actor_field: ClassVar[str | None] = None
    # How long an aggregate with nothing pending (no timer, effect or unstored event) stays a
    # running workflow after its last command; then its run stores what it carries and ends,
    # and the next command starts a new run that loads it (docs/explanation/aggregates.md).
    # None: never (an aggregate that must answer queries from Temporal at any time).
    passivate_after: ClassVar[timedelta | None] = timedelta(hours=1)

    def initial_state(self) -> StateT:
        raise NotImplementedError

    def passivate_after_s(self) -> float:
        """`passivate_after` in seconds, as a run's start input carries it; 0 for never."""
        after = self.passivate_after
        return 0.0 if after is None else after.total_seconds()

    def decide(self, state: StateT, command: Command, now: datetime) -> list[Event]:
        raise NotImplementedError

    def evolve(self, state: StateT, event: Event) -> StateT:
        raise NotImplementedError

    def timers(self, state: StateT) -> list[Timer]:
        """Timers the state wants running; none by default."""
        return []

    def plan_effects(
        self, aggregate_id: str, event_seq: int, event: Event, state: StateT
    ) -> list[PlannedEffect]:
        """The effects the event's policy asks for, keyed; ValueError for a policy that names
        two effects alike or gives a name that cannot be part of a key."""
        policy = self.policies.get(type(event).__name__)
        if policy is None:
            return []
        planned: list[PlannedEffect] = []
        for effect in policy(event, state):
            if not _EFFECT_NAME.match(effect.name):
                raise ValueError(f"effect name {effect.name!r} must match {EFFECT_NAME_PATTERN}")
            key = effect_key(self.type_name, aggregate_id, event_seq, effect.name)
            if any(earlier.key == key for earlier in planned):
                raise ValueError(f"two effects named {effect.name!r} for one event")
            planned.append(PlannedEffect(key, event_seq, effect.name, effect.action))
        return planned

    def may_read_secrets(self, state: StateT, actor: str) -> bool:
        """Whether `actor` may see the `SECRET` fields of the state and the events; nobody may
        by default."""
        return False

    # Who acts and what they see, shared by every definition.

    def command_actor(self, payload: Mapping[str, Any]) -> str | None:
        """The actor a command's payload names, if the definition has an actor field."""
        if self.actor_field is None:
            return None
        actor = payload.get(self.actor_field)
        return actor if isinstance(actor, str) else None

    def redact_state(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """The state's JSON with each secret field that holds a value shown as `REDACTED`."""
        return _redact(data, self.state_model)

    def redact_event(self, type_name: str, data: Mapping[str, Any]) -> dict[str, Any]:
        """An event's JSON with its secret fields redacted; an unknown type is left as it is."""
        event_type = self._event_types().get(type_name)
        return dict(data) if event_type is None else _redact(data, event_type)

    def has_secrets(self) -> bool:
        return any(_secret_fields(model) for model in (self.state_model, *self.events))

    # Parsing, shared by every definition: the workflow and the API speak JSON.

    def parse_command(self, name: str, payload: Mapping[str, Any]) -> Command:
        """The typed command; KeyError for an unknown name, pydantic's ValidationError for a
        payload that does not fit."""
        return self.commands[name].model_validate(payload)

    def parse_event(self, type_name: str, data: Mapping[str, Any]) -> Event:
        return self._event_types()[type_name].model_validate(data)

    def load_state(self, data: Mapping[str, Any]) -> StateT:
        state: StateT = self.state_model.model_validate(data)  # type: ignore[assignment]
        return state

    @classmethod
    def _event_types(cls) -> dict[str, type[Event]]:
        return {event.__name__: event for event in cls.events}


def _secret_fields(model: type[BaseModel]) -> frozenset[str]:
    """The model's fields annotated `SECRET` (top-level fields only)."""
    return frozenset(name for name, info in model.model_fields.items() if SECRET in info.metadata)


def _redact(data: Mapping[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    # A secret not set (None) stays None: whether it is set is no secret.
    secrets = _secret_fields(model)
    return {
        name: REDACTED if name in secrets and value is not None else value
        for name, value in data.items()
    }


def by_type_name(
    definitions: Iterable[AggregateDefinition[Any]] | Mapping[str, AggregateDefinition[Any]],
) -> dict[str, AggregateDefinition[Any]]:
    """The definitions by their `type_name`; ValueError for two of one name, or a mapping that
    files a definition under another name."""
    if isinstance(definitions, Mapping):
        for name, definition in definitions.items():
            if name != definition.type_name:
                raise ValueError(f"{definition.type_name!r} registered as {name!r}")
            _check_passivate_after(definition)
        return dict(definitions)
    found: dict[str, AggregateDefinition[Any]] = {}
    for definition in definitions:
        _check_passivate_after(definition)
        if definition.type_name in found:
            raise ValueError(f"two aggregate types named {definition.type_name!r}")
        found[definition.type_name] = definition
    return found


def _check_passivate_after(definition: AggregateDefinition[Any]) -> None:
    after = definition.passivate_after
    if after is not None and after <= timedelta(0):
        raise ValueError(
            f"{definition.type_name}.passivate_after must be positive, not {after} (None: never)"
        )


def describe_invalid(err: ValidationError) -> str:
    """Each problem of a payload as `field: message`, without echoing the input."""
    problems = []
    for error in err.errors():
        location = ".".join(str(part) for part in error["loc"])
        problems.append(f"{location}: {error['msg']}" if location else error["msg"])
    return "; ".join(problems)
