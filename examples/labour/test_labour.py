"""The labour definition and its policies as plain functions: roles, contractions, tokens, and
the effects an event asks for, keyed so that each happens once. No Temporal."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from durable_outbox_temporal.aggregate_definition import (
    REDACTED,
    RESERVED_ACTORS,
    SYSTEM_ACTOR,
    AggregateDefinition,
    Conflict,
    Effect,
    EnqueueItem,
    Event,
    InvalidCommand,
    IssueCommand,
)
from pydantic import ValidationError

from examples.labour.domainmodel import (
    EMAIL_DESTINATION,
    NOTIFICATIONS_OUTBOX,
    WEBHOOK_DESTINATION,
    Contact,
    LabourPlanned,
    LabourState,
    LabourTracking,
    NotAllowed,
    UpdatePosted,
    WrongToken,
)

NOW = datetime(2026, 11, 23, 12, tzinfo=UTC)


def decide(
    definition: AggregateDefinition[Any], state: Any, name: str, payload: dict[str, Any]
) -> list[Event]:
    return definition.decide(state, definition.parse_command(name, payload), NOW)


LABOUR = LabourTracking()
TOKEN = "t" * 32
PLAN = (
    "plan_labour",
    {"actor": "m1", "mother_name": "Ada", "contact": {"email": "ada@example.com"}},
)


def apply(state: LabourState, name: str, payload: dict[str, Any]) -> LabourState:
    for event in decide(LABOUR, state, name, payload):
        state = LABOUR.evolve(state, event)
    return state


def with_subscribers() -> LabourState:
    """Planned, token set; s1 (email) a birth partner, s2 (email + webhook) an observer, s3
    asked and not approved."""
    state = apply(LABOUR.initial_state(), *PLAN)
    state = apply(state, "set_subscription_token", {"actor": SYSTEM_ACTOR, "token": TOKEN})
    contacts = {
        "s1": {"email": "bo@example.com"},
        "s2": {"email": "cy@example.com", "webhook": "https://hooks.example.com/cy"},
        "s3": {"email": "di@example.com"},
    }
    for subscriber, contact in contacts.items():
        state = apply(
            state,
            "request_access",
            {"actor": subscriber, "token": TOKEN, "name": subscriber.upper(), "contact": contact},
        )
    state = apply(
        state, "approve_subscriber", {"actor": "m1", "subscriber": "s1", "role": "birth_partner"}
    )
    return apply(
        state, "approve_subscriber", {"actor": "m1", "subscriber": "s2", "role": "observer"}
    )


def test_a_planned_labour_asks_for_its_subscription_token() -> None:
    state = LABOUR.initial_state()
    (planned,) = decide(LABOUR, state, *PLAN)
    state = LABOUR.evolve(state, planned)

    effects = LABOUR.plan_effects("lab-1", 1, planned, state)

    assert isinstance(planned, LabourPlanned) and state.mother == "m1"
    assert [(e.key, e.action) for e in effects] == [
        (
            "labour:lab-1:1:subscription-token",
            IssueCommand(
                "set_subscription_token", {"actor": SYSTEM_ACTOR}, generated_tokens=("token",)
            ),
        )
    ]
    with pytest.raises(NotAllowed):
        decide(LABOUR, state, "set_subscription_token", {"actor": "m1", "token": TOKEN})
    # Set once: a repeated effect changes nothing.
    state = apply(state, "set_subscription_token", {"actor": SYSTEM_ACTOR, "token": TOKEN})
    assert (
        decide(LABOUR, state, "set_subscription_token", {"actor": SYSTEM_ACTOR, "token": "x" * 32})
        == []
    )


def test_access_needs_the_token_and_roles_limit_what_each_may_do() -> None:
    state = with_subscribers()
    request = {
        "actor": "s9",
        "token": "wrong",
        "name": "Ed",
        "contact": {"email": "ed@example.com"},
    }

    with pytest.raises(WrongToken):
        decide(LABOUR, state, "request_access", request)
    # Only the mother approves or removes; an observer may not time or post.
    with pytest.raises(NotAllowed):
        decide(
            LABOUR,
            state,
            "approve_subscriber",
            {"actor": "s1", "subscriber": "s3", "role": "observer"},
        )
    with pytest.raises(NotAllowed):
        decide(LABOUR, state, "start_contraction", {"actor": "s2"})
    with pytest.raises(NotAllowed):
        decide(LABOUR, state, "post_update", {"actor": "s3", "message": "hi"})
    # A birth partner may.
    assert decide(LABOUR, state, "start_contraction", {"actor": "s1"})
    assert decide(LABOUR, state, "post_update", {"actor": "s1", "message": "4 cm"})
    with pytest.raises(ValidationError):
        LABOUR.parse_command(
            "approve_subscriber", {"actor": "m1", "subscriber": "s3", "role": "boss"}
        )


def test_contractions_never_overlap() -> None:
    state = apply(with_subscribers(), "start_contraction", {"actor": "m1"})

    with pytest.raises(Conflict):
        decide(LABOUR, state, "start_contraction", {"actor": "s1"})
    state = apply(state, "end_contraction", {"actor": "s1"})
    with pytest.raises(Conflict):
        decide(LABOUR, state, "end_contraction", {"actor": "m1"})
    state = apply(state, "start_contraction", {"actor": "s1"})

    assert [c.ended_at is None for c in state.contractions] == [False, True]
    assert state.contractions[0].started_at == NOW


def test_an_announcement_notifies_each_approved_subscriber_on_each_contact_once() -> None:
    state = with_subscribers()
    (event,) = decide(
        LABOUR,
        state,
        "post_update",
        {"actor": "m1", "message": "It's a girl", "kind": "announcement"},
    )
    state = LABOUR.evolve(state, event)

    effects = LABOUR.plan_effects("lab-1", 9, event, state)

    assert [
        (e.key, e.action.destination) for e in effects if isinstance(e.action, EnqueueItem)
    ] == [
        ("labour:lab-1:9:notify.s1.email", EMAIL_DESTINATION),
        ("labour:lab-1:9:notify.s2.email", EMAIL_DESTINATION),
        ("labour:lab-1:9:notify.s2.webhook", WEBHOOK_DESTINATION),
    ]
    assert all(
        isinstance(e.action, EnqueueItem) and e.action.outbox == NOTIFICATIONS_OUTBOX
        for e in effects
    )
    first = effects[0].action
    assert isinstance(first, EnqueueItem)
    assert first.payload["recipients"] == {"to": [{"address": "bo@example.com"}]}
    assert first.payload["content"]["plainText"] == "It's a girl"
    hook = effects[2].action
    assert isinstance(hook, EnqueueItem)
    assert hook.payload["subscriber"] == "s2" and hook.payload["webhook"].startswith("https://")
    # Pure: the same event and state plan the same effects, keys included.
    assert LABOUR.plan_effects("lab-1", 9, event, state) == effects
    # A status update notifies nobody; a removed subscriber is not notified.
    (status,) = decide(LABOUR, state, "post_update", {"actor": "m1", "message": "5 cm"})
    assert LABOUR.plan_effects("lab-1", 10, status, state) == []
    state = apply(state, "remove_subscriber", {"actor": "m1", "subscriber": "s2"})
    (again,) = decide(
        LABOUR, state, "post_update", {"actor": "m1", "message": "Home", "kind": "announcement"}
    )
    assert [e.name for e in LABOUR.plan_effects("lab-1", 12, again, state)] == ["notify.s1.email"]


def test_a_completed_labour_refuses_changes() -> None:
    state = apply(with_subscribers(), "complete_labour", {"actor": "m1"})

    assert state.status == "completed"
    with pytest.raises(Conflict):
        decide(LABOUR, state, "post_update", {"actor": "m1", "message": "late"})
    with pytest.raises(NotAllowed):
        decide(LABOUR, with_subscribers(), "complete_labour", {"actor": "s1"})


class _Twice(AggregateDefinition[LabourState]):
    """A definition whose policy names two effects alike: refused, never half-keyed."""

    type_name = "twice"
    state_model = LabourState
    commands = {}
    events = (UpdatePosted,)
    policies = {
        "UpdatePosted": lambda event, state: [
            Effect("same", IssueCommand("x")),
            Effect("same", IssueCommand("y")),
        ]
    }


def test_a_policy_naming_two_effects_alike_is_refused() -> None:
    event: Event = UpdatePosted(by="m1", message="m", kind="status", at=NOW)

    with pytest.raises(ValueError, match="two effects named 'same'"):
        _Twice().plan_effects("a", 1, event, LabourState())
    with pytest.raises(InvalidCommand):
        decide(
            LABOUR,
            with_subscribers(),
            "request_access",
            {"actor": "m1", "token": TOKEN, "name": "Ada", "contact": {"email": "ada@example.com"}},
        )


def test_each_command_names_its_actor_and_system_is_reserved() -> None:
    assert LABOUR.actor_field == "actor"
    assert LABOUR.command_actor({"actor": "m1", "subscriber": "s1"}) == "m1"
    assert LABOUR.command_actor({}) is None
    # The token policy's command acts as `system`, which no caller may claim at the API.
    [effect] = LABOUR.plan_effects(
        "lab-1",
        1,
        LabourPlanned(mother="m1", mother_name="Ada", contact=Contact(email="a@x.io")),
        LabourState(),
    )
    assert isinstance(effect.action, IssueCommand)
    assert LABOUR.command_actor(effect.action.payload) == SYSTEM_ACTOR in RESERVED_ACTORS


def test_the_subscription_token_is_shown_to_the_mother_only() -> None:
    state = with_subscribers()
    data = state.model_dump(mode="json")

    assert LABOUR.has_secrets()
    assert LABOUR.may_read_secrets(state, "m1")
    assert not any(LABOUR.may_read_secrets(state, who) for who in ("s1", "s2", "x", "system"))
    assert not LABOUR.may_read_secrets(LabourState(), "m1")  # unplanned: no mother yet
    redacted = LABOUR.redact_state(data)
    assert redacted["subscription_token"] == REDACTED != data["subscription_token"] == TOKEN
    assert {k: v for k, v in redacted.items() if k != "subscription_token"} == {
        k: v for k, v in data.items() if k != "subscription_token"
    }
    # A token not set yet stays null; the event that sets it is redacted too.
    assert LABOUR.redact_state({"subscription_token": None}) == {"subscription_token": None}
    assert LABOUR.redact_event("SubscriptionTokenSet", {"token": TOKEN}) == {"token": REDACTED}
    planned = {"mother": "m1", "mother_name": "Ada", "contact": {"email": "a@x.io"}}
    assert LABOUR.redact_event("LabourPlanned", planned) == planned
