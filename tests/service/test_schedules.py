"""Scheduled fan-out in the service layer: creation checks every rule a batch enqueue applies
(the enqueue activity: `tests/activities/test_schedules.py`)."""

from __future__ import annotations

from typing import Any

import pytest
from durable_outbox_temporal import OutboxClient, TemporalConnection
from durable_outbox_temporal.contract.schedule import ItemTemplate
from durable_outbox_temporal.destinations import DestinationRegistry

from devstack.fake_provider import FakeProvider
from service.schedules import InvalidSchedule, NewSchedule, ScheduleService
from tests.conftest import webhook_destination


def webhook_item(**fields: Any) -> ItemTemplate:
    return ItemTemplate(**{"destination": "hooks", "payload": {"n": 1}, **fields})


def valid(**fields: Any) -> NewSchedule:
    defaults: dict[str, Any] = {
        "id": "daily",
        "outbox": "news",
        "items": [webhook_item()],
        "cron": "0 6 * * *",
    }
    return NewSchedule(**{**defaults, **fields})


@pytest.fixture
def service(fake_provider: FakeProvider) -> ScheduleService:
    # Never connects: every check here is made before Temporal is asked anything.
    registry = DestinationRegistry({"hooks": webhook_destination(fake_provider, name="hooks")})
    return ScheduleService(OutboxClient(TemporalConnection(), registry), "ops")


@pytest.mark.parametrize(
    ("change", "location"),
    [
        ({"id": "has/slash"}, "id"),
        ({"outbox": "-bad"}, "outbox"),
        ({"cron": None}, "cron"),
        ({"interval_seconds": 60}, "cron"),  # both given
        ({"cron": None, "interval_seconds": 0}, "interval_seconds"),
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"catchup_window_seconds": 5}, "catchup_window_seconds"),
        ({"note": "x" * 501}, "note"),
        ({"items": []}, "items"),
        ({"items": [webhook_item()] * 101}, "items"),
        ({"items": [webhook_item(), webhook_item(destination="nope")]}, "items.1.destination"),
        ({"items": [webhook_item(key_suffix="a b")]}, "items.0.key_suffix"),
        ({"items": [webhook_item(), webhook_item(key_suffix="0")]}, "items.1.key_suffix"),
        ({"items": [webhook_item(ordering_key="a/b")]}, "items.0.ordering_key"),
        ({"items": [webhook_item(max_attempts=0)]}, "items.0.max_attempts"),
        # Values no provider can be sent (issue 32): refused without the API too.
        ({"items": [webhook_item(payload={"n": float("nan")})]}, "items.0.payload"),
        ({"items": [webhook_item(payload={"s": "\ud800"})]}, "items.0.payload"),
        (
            {"items": [webhook_item(payload={"to": ["x", {"when": "{{fire_time}}"}]})]},
            "items.0.payload.to.1.when",
        ),
    ],
)
def test_creation_refuses_each_invalid_field_by_name(
    service: ScheduleService, change: dict[str, Any], location: str
) -> None:
    with pytest.raises(InvalidSchedule) as refused:
        service.validate(valid(**change))

    assert location in [where for where, _ in refused.value.errors]


def test_a_valid_schedule_passes_and_every_bad_field_is_listed(service: ScheduleService) -> None:
    service.validate(valid(items=[webhook_item(payload={"s": "{{ fire_date }} {{item_key}}"})]))

    with pytest.raises(InvalidSchedule) as refused:
        service.validate(valid(id="", items=[webhook_item(destination="nope")]))
    assert [where for where, _ in refused.value.errors] == ["id", "items.0.destination"]
    assert "unknown destination 'nope' (configured: hooks)" in str(refused.value)
