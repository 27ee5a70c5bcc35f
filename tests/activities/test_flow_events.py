"""What an operator's webhook gets for each flow event (`activities/flow_events.py`)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from durable_outbox_temporal.contract.flow import NOTIFIED_KINDS, FlowEvent, FlowNotice

from activities.flow_events import EVENT_TYPES, event_key, event_payload

AT = datetime(2026, 11, 28, 10, 0, tzinfo=UTC)


def notice(kind: str) -> FlowNotice:
    return FlowNotice(
        destination="hook",
        events_destination="ops",
        event=FlowEvent(at=AT, kind=kind, detail="failing for 3.0 days; last: HTTP 500", rate=0.0),
        circuit="closed",
    )


@pytest.mark.parametrize("kind", NOTIFIED_KINDS)
def test_every_kind_sent_has_an_event_type_of_its_own(kind: str) -> None:
    assert kind in EVENT_TYPES
    assert event_payload(notice(kind))["type"] == EVENT_TYPES[kind]


def test_a_disable_says_which_destination_when_and_why() -> None:
    payload = event_payload(notice("disabled"))
    assert payload == {
        "type": "destination.disabled",
        "destination": "hook",
        "at": AT.isoformat(),
        "detail": "failing for 3.0 days; last: HTTP 500",
        "circuit": "closed",
        "paused_until": None,
        "submit_rate": 0.0,
    }
    assert event_key(notice("disabled")) != event_key(notice("opened"))
