"""The attempt log's store: secrets left out, bodies capped, numbering and retention."""

from __future__ import annotations

import sqlite3
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from readmodel import attempts
from readmodel.db import lock_scopes, make_engine


def test_headers_without_secrets_and_a_capped_body_are_stored_numbered(engine: Engine) -> None:
    with attempts.capture("submit") as made:
        attempts.note(
            "POST",
            "https://host.example/emails:send?api-version=1&token=abc",
            {"Authorization": "HMAC x", "webhook-signature": "v1,s", "Content-Type": "a/b"},
            datetime.now(UTC),
            12,
            status=202,
            response_headers={"Operation-Location": "https://h/op?token=abc", "X-Other": "1"},
            body="x" * 5000,
        )
    attempts.write_attempts(engine, "outbox/t/a", made)
    attempts.write_attempts(engine, "outbox/t/a", made)

    stored = attempts.read_attempts(engine, "outbox/t/a")
    assert [a["n"] for a in stored] == [1, 2]
    first = stored[0]
    assert first["request"] == {
        "method": "POST",
        "host": "host.example",
        "path": "/emails:send",
        "headers": {"Content-Type": "a/b"},
    }
    assert first["response"]["headers"] == {"operation-location": "https://h/op?token=***"}
    assert len(first["response"]["body"]) == attempts.BODY_LIMIT
    assert first["response"]["body_truncated"] is True


def test_only_the_newest_attempts_are_kept(engine: Engine) -> None:
    with attempts.capture("poll") as made:
        for _ in range(attempts.KEEP_PER_ITEM + 20):
            attempts.note("GET", "https://h/op", {}, datetime.now(UTC), 1, status=200)
    attempts.write_attempts(engine, "outbox/t/b", made)

    numbers = [a["n"] for a in attempts.read_attempts(engine, "outbox/t/b")]
    assert numbers[-1] == attempts.KEEP_PER_ITEM + 20
    assert len(numbers) == attempts.KEEP_PER_ITEM


def test_no_capture_no_note() -> None:
    attempts.note("GET", "https://h/", {}, datetime.now(UTC), 1, status=200)  # does nothing


def test_headers_are_kept_by_an_allowlist_only() -> None:
    sent = {
        "X-Password": "p",
        "X-Api-Pass": "p",
        "X-Client-Pwd": "p",
        "X-Session": "s",
        "X-Passphrase": "p",
        "X-Custom": "c",
        "Content-Type": "application/json",
        "Content-Length": "12",
        "Idempotency-Key": "k1",
        "webhook-id": "msg_1",
        "X-Request-Id": "r1",
    }
    with attempts.capture("submit") as made:
        attempts.note(
            "POST",
            "https://h/send",
            sent,
            datetime.now(UTC),
            1,
            status=429,
            response_headers={
                "X-RateLimit-Remaining": "0",
                "RateLimit-Reset": "3",
                "Retry-After": "3",
                "Date": "Sat, 28 Nov 2026 07:00:00 GMT",
                "Set-Cookie": "session=abc",
                "X-Session": "s",
            },
        )
    (attempt,) = made
    assert attempt.request_headers == {
        "Content-Type": "application/json",
        "Content-Length": "12",
        "Idempotency-Key": "k1",
        "webhook-id": "msg_1",
        "X-Request-Id": "r1",
    }
    assert attempt.response_headers == {
        "x-ratelimit-remaining": "0",
        "ratelimit-reset": "3",
        "retry-after": "3",
        "date": "Sat, 28 Nov 2026 07:00:00 GMT",
    }


def _attempt() -> attempts.Attempt:
    with attempts.capture("submit") as made:
        attempts.note("POST", "https://h/send", {}, datetime.now(UTC), 1, status=202)
    return made[0]


def test_a_batch_numbers_each_item_after_its_own_last(engine: Engine) -> None:
    attempts.write_attempts(engine, "outbox/t/c", [_attempt()])
    batch = [("outbox/t/c", _attempt()), ("outbox/t/d", _attempt()), ("outbox/t/c", _attempt())]

    attempts.write_batch(engine, batch)

    assert [a.n for _, a in batch] == [2, 1, 3]
    assert [a["n"] for a in attempts.read_attempts(engine, "outbox/t/c")] == [1, 2, 3]
    assert [a["n"] for a in attempts.read_attempts(engine, "outbox/t/d")] == [1]


def test_writers_of_one_items_attempts_at_once_lose_none(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writers number the same item's attempts at once: each holds the item's numbering while
    it writes, so none is lost or numbered twice, with no second try to lean on (a loaded CI
    run once lost one when five tries met the other writer each time)."""
    monkeypatch.setattr(attempts, "_NUMBER_TRIES", 1)

    def write(count: int) -> None:
        for _ in range(count):
            attempts.write_batch(engine, [("outbox/t/e", _attempt()), ("outbox/t/e", _attempt())])

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(write, [10] * 4))

    numbers = [a["n"] for a in attempts.read_attempts(engine, "outbox/t/e")]
    # 80 written; the oldest pruned every tenth number, down to the newest 50 to 59.
    assert numbers[-1] == 80 and numbers == list(range(numbers[0], 81))
    assert attempts.KEEP_PER_ITEM <= len(numbers) < attempts.KEEP_PER_ITEM + 10


def test_on_sqlite_held_scopes_keep_other_writers_out_from_before_the_first_read(
    tmp_path: Path,
) -> None:
    """The attempt log reads an item's last number, then writes after it. SQLite opened the
    transaction only at the write, so a writer that waited there wrote numbers read before
    other writers committed theirs, and pruned: two attempts of 80 were lost so in a loaded
    run. Holding a scope on SQLite takes the write lock at once."""
    path = tmp_path / "held.db"
    engine = make_engine(f"sqlite:///{path}")
    with engine.begin() as holder:
        lock_scopes(holder, ["attempts/outbox/t/f"])
        holder.execute(text("SELECT 1")).scalar_one()
        other = sqlite3.connect(path, timeout=0.1)
        try:
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")
        finally:
            other.close()
    engine.dispose()
