"""The dead-letter view and discards, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from durable_outbox_temporal.contract.dead_letters import DeadLetterFilter
from durable_outbox_temporal.contract.item import ItemProjection, ItemStatus
from sqlalchemy import Engine

from readmodel import store
from readmodel.dead_letters import discard, list_dead_letters
from tests.readmodel.test_store import T0, view

ALL = DeadLetterFilter()


def fail(engine: Engine, key: str, minute: int, seq: int = 3, **fields: object) -> None:
    """Project `key` as failed at T0 + `minute` minutes (its failure at event `seq`)."""
    failed = view(key, seq, ItemStatus.FAILED, finished_at=T0 + timedelta(minutes=minute), **fields)
    store.apply_projection(engine, ItemProjection(view=failed, events=[]))


def keys(engine: Engine, which: DeadLetterFilter = ALL, **options: object) -> list[str]:
    letters, _ = list_dead_letters(engine, "o", which, **options)  # type: ignore[arg-type]
    return [letter.record.view.key for letter in letters]


def test_failed_items_newest_failure_first_and_filtered(engine: Engine) -> None:
    fail(engine, "a", 1, destination="mail", last_error_code="Bounced")
    fail(engine, "b", 2, destination="hook")
    fail(engine, "c", 3, destination="mail")
    sent = view("d", 3, ItemStatus.SENT, finished_at=T0 + timedelta(minutes=4))
    store.apply_projection(engine, ItemProjection(view=sent, events=[]))

    assert keys(engine) == ["c", "b", "a"]
    assert keys(engine, DeadLetterFilter(destination="mail")) == ["c", "a"]
    assert keys(engine, DeadLetterFilter(error_code="Bounced")) == ["a"]
    window = DeadLetterFilter(
        failed_from=T0 + timedelta(minutes=2), failed_to=T0 + timedelta(minutes=3)
    )
    assert keys(engine, window) == ["b"]
    assert keys(engine, failed_before=T0 + timedelta(minutes=2)) == ["a"]


def test_pages_hold_while_items_leave_the_list(engine: Engine) -> None:
    for minute, key in enumerate("abcde"):
        fail(engine, key, minute)
    first, cursor = list_dead_letters(engine, "o", ALL, limit=2)
    assert [letter.record.view.key for letter in first] == ["e", "d"]
    # Redriven meanwhile: the first page's items are queued again.
    for letter in first:
        queued = view(letter.record.view.key, 4, ItemStatus.QUEUED)
        store.apply_projection(engine, ItemProjection(view=queued, events=[]))
    second, cursor = list_dead_letters(engine, "o", ALL, cursor=cursor, limit=2)
    third, last = list_dead_letters(engine, "o", ALL, cursor=cursor, limit=2)

    assert [letter.record.view.key for letter in second] == ["c", "b"]
    assert [letter.record.view.key for letter in third] == ["a"] and last is None


def test_a_discard_hides_its_failure_only(engine: Engine) -> None:
    fail(engine, "a", 1)
    fail(engine, "b", 2)
    first = discard(engine, "o", "outbox/o/a", 3, "bad address", T0)
    again = discard(engine, "o", "outbox/o/a", 3, "another reason", T0 + timedelta(hours=1))

    assert keys(engine) == ["b"]
    listed, _ = list_dead_letters(engine, "o", ALL, include_discarded=True)
    assert [(x.record.view.key, x.discard) for x in listed] == [("b", None), ("a", first)]
    assert again == first and first.reason == "bad address"

    # Redriven, failed again: a new dead letter, whose discard replaces the old one.
    fail(engine, "a", 5, seq=7)
    assert keys(engine) == ["a", "b"]
    newer = discard(engine, "o", "outbox/o/a", 7, "still bad", T0 + timedelta(hours=2))
    assert newer.reason == "still bad" and keys(engine) == ["b"]


def test_a_bad_cursor_is_refused(engine: Engine) -> None:
    with pytest.raises(store.InvalidCursor):
        list_dead_letters(engine, "o", ALL, cursor="not-a-cursor")
