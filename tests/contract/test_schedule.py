"""The scheduled fan-out template: keys per fire time, placeholders and their values."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from durable_outbox_temporal.contract.schedule import (
    fire_values,
    item_key,
    render,
    unknown_placeholders,
)


def test_an_item_key_is_the_fire_time_in_whole_utc_seconds() -> None:
    fire = datetime(2025, 1, 31, 23, 30, 0, 750_000, tzinfo=UTC)
    same_fire_in_paris = fire.astimezone(timezone(timedelta(hours=1)))

    assert item_key("digest", fire, "0") == "digest:20250131T233000Z:0"
    assert item_key("digest", same_fire_in_paris, "0") == item_key("digest", fire, "0")
    assert item_key("digest", fire + timedelta(seconds=1), "0") != item_key("digest", fire, "0")


def test_fire_date_is_the_date_in_the_schedules_time_zone() -> None:
    fire = datetime(2025, 1, 31, 23, 30, tzinfo=UTC)

    paris = fire_values("digest", fire, "Europe/Paris", "k")
    utc = fire_values("digest", fire, None, "k")

    assert paris["fire_date"] == "2025-02-01" and utc["fire_date"] == "2025-01-31"
    assert paris["scheduled_at"] == "2025-01-31T23:30:00Z"
    assert paris["schedule_id"] == "digest" and paris["item_key"] == "k"


def test_render_fills_placeholders_in_nested_strings_only() -> None:
    payload = {
        "subject": "Digest for {{fire_date}}",
        "meta": {"at": "{{ scheduled_at }}", "tags": ["{{schedule_id}}", 7, None]},
        "{{fire_date}}": "keys of objects stay as they are",
        "count": 3,
    }
    values = {"fire_date": "2025-02-01", "scheduled_at": "T", "schedule_id": "digest"}

    assert render(payload, values) == {
        "subject": "Digest for 2025-02-01",
        "meta": {"at": "T", "tags": ["digest", 7, None]},
        "{{fire_date}}": "keys of objects stay as they are",
        "count": 3,
    }


def test_unknown_placeholders_are_found_with_their_path() -> None:
    payload = {"a": ["ok {{fire_date}}", {"b": "{{fire_time}} and {{}}"}], "c": "{{item_key}}"}

    assert list(unknown_placeholders(payload)) == [
        (["a", 1, "b"], "fire_time"),
        (["a", 1, "b"], ""),
    ]
