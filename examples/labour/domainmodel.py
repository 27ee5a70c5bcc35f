"""Labour tracking: one aggregate per labour, its subscribers and what they may do.

Roles: the mother planned the labour and may do everything; an approved `birth_partner` may time
contractions and post updates; an approved `observer` may only read (the API's reads need no
role). Every command names its `actor`, which the API checks against the caller's token; the
`system` actor is the service's own. The subscription token is secret: only the mother sees it
in the API's state and events. Two policies turn events into effects: a planned labour
gets a subscription token (an effect that issues `set_subscription_token` back, the token made by
the effect executor), and an announcement notifies every approved subscriber on each of their
contact methods through the outbox (`labour-notifications`), one item per subscriber, contact
and announcement.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from durable_outbox_temporal.aggregate_definition import (
    SECRET,
    SYSTEM_ACTOR,
    AggregateDefinition,
    Command,
    Conflict,
    Effect,
    EnqueueItem,
    Event,
    InvalidCommand,
    IssueCommand,
    Projector,
)
from pydantic import BaseModel, Field, StringConstraints, model_validator

NOTIFICATIONS_OUTBOX = "labour-notifications"
EMAIL_DESTINATION = "fake-email"
WEBHOOK_DESTINATION = "fake-webhook"
SENDER = "labour@example.com"

# Letters, digits and `._-`: user ids become part of effect names and idempotency keys.
UserId = Annotated[
    str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]
Role = Literal["birth_partner", "observer"]


class NotAllowed(Conflict):
    """The actor's role does not allow the command."""


class WrongToken(Conflict):
    """The subscription token does not match."""


class Contact(BaseModel):
    """How to reach someone: an email address, a webhook URL, or both."""

    model_config = {"extra": "forbid", "frozen": True}

    email: str | None = Field(default=None, max_length=254, pattern=r"^[^@\s]+@[^@\s]+$")
    webhook: str | None = Field(default=None, max_length=2000, pattern=r"^https?://\S+$")

    @model_validator(mode="after")
    def _some(self) -> Contact:
        if self.email is None and self.webhook is None:
            raise ValueError("give an email, a webhook, or both")
        return self


# Commands: verbs, as the API names them; each carries its actor.


class PlanLabour(Command):
    actor: UserId
    mother_name: str = Field(min_length=1, max_length=200)
    contact: Contact


class SetSubscriptionToken(Command):
    actor: UserId
    token: str = Field(min_length=16, max_length=128)


class RequestAccess(Command):
    actor: UserId
    token: str = Field(min_length=1, max_length=128)
    name: str = Field(min_length=1, max_length=200)
    contact: Contact


class ApproveSubscriber(Command):
    actor: UserId
    subscriber: UserId
    role: Role


class RemoveSubscriber(Command):
    actor: UserId
    subscriber: UserId


class StartContraction(Command):
    actor: UserId


class EndContraction(Command):
    actor: UserId


class PostUpdate(Command):
    actor: UserId
    message: str = Field(min_length=1, max_length=2000)
    kind: Literal["status", "announcement"] = "status"


class CompleteLabour(Command):
    actor: UserId


# Events.


class LabourPlanned(Event):
    mother: str
    mother_name: str
    contact: Contact


class SubscriptionTokenSet(Event):
    token: Annotated[str, SECRET]


class AccessRequested(Event):
    subscriber: str
    name: str
    contact: Contact


class SubscriberApproved(Event):
    subscriber: str
    role: Role


class SubscriberRemoved(Event):
    subscriber: str


class ContractionStarted(Event):
    by: str
    at: datetime


class ContractionEnded(Event):
    by: str
    at: datetime


class UpdatePosted(Event):
    by: str
    message: str
    kind: Literal["status", "announcement"]
    at: datetime


class LabourCompleted(Event):
    at: datetime


class Subscriber(BaseModel):
    name: str
    contact: Contact
    # None until the mother approves the request.
    role: Role | None = None


class Contraction(BaseModel):
    started_at: datetime
    ended_at: datetime | None = None


class Update(BaseModel):
    by: str
    message: str
    kind: Literal["status", "announcement"]
    at: datetime


class LabourState(BaseModel):
    status: Literal["unplanned", "planned", "completed"] = "unplanned"
    mother: str | None = None
    mother_name: str | None = None
    contact: Contact | None = None
    # Whoever knows it may request access: the mother shares it, the API shows it to her only.
    subscription_token: Annotated[str | None, SECRET] = None
    subscribers: dict[str, Subscriber] = Field(default_factory=dict)
    contractions: list[Contraction] = Field(default_factory=list)
    updates: list[Update] = Field(default_factory=list)


def _subscription_token(event: Event, state: LabourState) -> list[Effect]:
    """A planned labour gets its token from the executor, issued back as a command."""
    command = IssueCommand(
        "set_subscription_token", {"actor": SYSTEM_ACTOR}, generated_tokens=("token",)
    )
    return [Effect("subscription-token", command)]


def _notify_subscribers(event: Event, state: LabourState) -> list[Effect]:
    """An announcement reaches every approved subscriber on each contact method, once."""
    assert isinstance(event, UpdatePosted)
    if event.kind != "announcement":
        return []
    effects = []
    subject = f"{state.mother_name or 'Labour'}: an announcement"
    for subscriber_id, subscriber in sorted(state.subscribers.items()):
        if subscriber.role is None:
            continue
        if subscriber.contact.email is not None:
            email = {
                "senderAddress": SENDER,
                "recipients": {"to": [{"address": subscriber.contact.email}]},
                "content": {"subject": subject, "plainText": event.message},
            }
            item = EnqueueItem(NOTIFICATIONS_OUTBOX, EMAIL_DESTINATION, email)
            effects.append(Effect(f"notify.{subscriber_id}.email", item))
        if subscriber.contact.webhook is not None:
            # One endpoint (the destination's, signed with its secret) receives every
            # subscriber's notification and forwards it to the URL named here: the outbox
            # never posts to a URL a user typed in.
            body = {
                "kind": "announcement",
                "message": event.message,
                "subscriber": subscriber_id,
                "webhook": subscriber.contact.webhook,
            }
            item = EnqueueItem(NOTIFICATIONS_OUTBOX, WEBHOOK_DESTINATION, body)
            effects.append(Effect(f"notify.{subscriber_id}.webhook", item))
    return effects


def _contraction_count(count: int, event: Event) -> int:
    return count + 1 if isinstance(event, ContractionStarted) else count


class LabourTracking(AggregateDefinition[LabourState]):
    type_name = "labour"
    state_model = LabourState
    commands = {
        "plan_labour": PlanLabour,
        "set_subscription_token": SetSubscriptionToken,
        "request_access": RequestAccess,
        "approve_subscriber": ApproveSubscriber,
        "remove_subscriber": RemoveSubscriber,
        "start_contraction": StartContraction,
        "end_contraction": EndContraction,
        "post_update": PostUpdate,
        "complete_labour": CompleteLabour,
    }
    events = (
        LabourPlanned,
        SubscriptionTokenSet,
        AccessRequested,
        SubscriberApproved,
        SubscriberRemoved,
        ContractionStarted,
        ContractionEnded,
        UpdatePosted,
        LabourCompleted,
    )
    projectors = {"contractions": Projector(initial=lambda: 0, apply=_contraction_count)}
    policies = {
        "LabourPlanned": _subscription_token,
        "UpdatePosted": _notify_subscribers,
    }
    actor_field = "actor"

    def initial_state(self) -> LabourState:
        return LabourState()

    def decide(self, state: LabourState, command: Command, now: datetime) -> list[Event]:
        if isinstance(command, PlanLabour):
            if state.status != "unplanned":
                raise Conflict("this labour is planned already")
            return [
                LabourPlanned(
                    mother=command.actor, mother_name=command.mother_name, contact=command.contact
                )
            ]
        if state.status == "unplanned":
            raise Conflict("plan the labour first")
        match command:
            case SetSubscriptionToken(actor=actor, token=token):
                if actor != SYSTEM_ACTOR:
                    raise NotAllowed("the subscription token is set by the system")
                return [] if state.subscription_token else [SubscriptionTokenSet(token=token)]
            case RequestAccess(actor=actor, token=token, name=name, contact=contact):
                if actor == state.mother:
                    raise InvalidCommand("the mother needs no access")
                if state.subscription_token is None or token != state.subscription_token:
                    raise WrongToken("the subscription token does not match")
                if actor in state.subscribers:
                    return []
                return [AccessRequested(subscriber=actor, name=name, contact=contact)]
            case ApproveSubscriber(actor=actor, subscriber=subscriber, role=role):
                self._require_mother(state, actor)
                if subscriber not in state.subscribers:
                    raise Conflict(f"{subscriber} has not requested access")
                if state.subscribers[subscriber].role == role:
                    return []
                return [SubscriberApproved(subscriber=subscriber, role=role)]
            case RemoveSubscriber(actor=actor, subscriber=subscriber):
                self._require_mother(state, actor)
                if subscriber not in state.subscribers:
                    return []
                return [SubscriberRemoved(subscriber=subscriber)]
            case StartContraction(actor=actor):
                self._require_partner(state, actor)
                if state.contractions and state.contractions[-1].ended_at is None:
                    raise Conflict("a contraction is under way; end it first")
                return [ContractionStarted(by=actor, at=now)]
            case EndContraction(actor=actor):
                self._require_partner(state, actor)
                if not state.contractions or state.contractions[-1].ended_at is not None:
                    raise Conflict("no contraction is under way")
                return [ContractionEnded(by=actor, at=now)]
            case PostUpdate(actor=actor, message=message, kind=kind):
                self._require_partner(state, actor)
                return [UpdatePosted(by=actor, message=message, kind=kind, at=now)]
            case CompleteLabour(actor=actor):
                self._require_mother(state, actor)
                return [LabourCompleted(at=now)]
        raise InvalidCommand(f"labour does not handle {type(command).__name__}")

    def may_read_secrets(self, state: LabourState, actor: str) -> bool:
        return state.mother is not None and actor == state.mother

    def evolve(self, state: LabourState, event: Event) -> LabourState:
        match event:
            case LabourPlanned(mother=mother, mother_name=name, contact=contact):
                return state.model_copy(
                    update={
                        "status": "planned",
                        "mother": mother,
                        "mother_name": name,
                        "contact": contact,
                    }
                )
            case SubscriptionTokenSet(token=token):
                return state.model_copy(update={"subscription_token": token})
            case AccessRequested(subscriber=subscriber, name=name, contact=contact):
                subscribers = {
                    **state.subscribers,
                    subscriber: Subscriber(name=name, contact=contact),
                }
                return state.model_copy(update={"subscribers": subscribers})
            case SubscriberApproved(subscriber=subscriber, role=role):
                approved = state.subscribers[subscriber].model_copy(update={"role": role})
                return state.model_copy(
                    update={"subscribers": {**state.subscribers, subscriber: approved}}
                )
            case SubscriberRemoved(subscriber=subscriber):
                subscribers = {k: v for k, v in state.subscribers.items() if k != subscriber}
                return state.model_copy(update={"subscribers": subscribers})
            case ContractionStarted(at=at):
                contractions = [*state.contractions, Contraction(started_at=at)]
                return state.model_copy(update={"contractions": contractions})
            case ContractionEnded(at=at):
                last = state.contractions[-1].model_copy(update={"ended_at": at})
                return state.model_copy(update={"contractions": [*state.contractions[:-1], last]})
            case UpdatePosted(by=by, message=message, kind=kind, at=at):
                update = Update(by=by, message=message, kind=kind, at=at)
                return state.model_copy(update={"updates": [*state.updates, update]})
            case LabourCompleted():
                return state.model_copy(update={"status": "completed"})
        return state

    @staticmethod
    def _require_mother(state: LabourState, actor: str) -> None:
        if actor != state.mother:
            raise NotAllowed("only the mother may do this")
        if state.status == "completed":
            raise Conflict("the labour is completed")

    @staticmethod
    def _require_partner(state: LabourState, actor: str) -> None:
        """The mother, or an approved birth partner, while the labour is not completed."""
        if state.status == "completed":
            raise Conflict("the labour is completed")
        if actor == state.mother:
            return
        subscriber = state.subscribers.get(actor)
        if subscriber is None or subscriber.role != "birth_partner":
            raise NotAllowed("only the mother or a birth partner may do this")
