"""The attempt log: each request an item's activities made to its provider (issue 32).

`send` (`activities/providers/base.py`) notes every HTTP exchange in the `capture()` the
submit or poll activity opened around its provider call; the activity then hands them to its
process's `AttemptLog`, which writes them in batches off the request's path, best effort (a
failed write is logged, never a failed delivery). Secrets stay
out: the URL keeps its host and path only, headers are kept by an allowlist (`kept_header`: content
type and length, dates, request, idempotency and webhook ids, rate-limit and retry headers; the
response also its `Operation-Location` and `Location`) and everything else is dropped, and the
body is capped. Each item keeps its newest `KEEP_PER_ITEM` attempts. Erasing an ended item
(`readmodel.erasure`) blanks the bodies and headers and keeps the numbers, statuses and times.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import random
import re
import time
import weakref
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import (
    Connection,
    Engine,
    and_,
    bindparam,
    delete,
    func,
    insert,
    literal,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from readmodel.db import lock_scopes
from readmodel.models import ITEM_ATTEMPTS, ITEM_ERASURES, ITEMS

log = logging.getLogger(__name__)

# Newest attempts kept per item; older ones go as new ones are written.
KEEP_PER_ITEM = 50
# Writes of one attempt that may meet another writer's number for the same item first.
_NUMBER_TRIES = 5
# Attempts written in one transaction at most (each is one INSERT ... SELECT).
MAX_BATCH = 200
# Response bodies are kept up to this many characters.
BODY_LIMIT = 2048
# Headers stored, by an allowlist: a header a provider invents (`X-Api-Pass`, `X-Session`) may
# carry a credential whatever it is called, so nothing outside this list is kept.
KEPT_HEADERS = frozenset(
    {
        "content-type",
        "content-length",
        "date",
        "x-ms-date",
        "x-request-id",
        "request-id",
        "x-correlation-id",
        "x-ms-request-id",
        "x-ms-client-request-id",
        "apim-request-id",
        "idempotency-key",
        "x-idempotency-key",
        "repeatability-request-id",
        "repeatability-first-sent",
        "webhook-id",
        "webhook-timestamp",
        "x-webhook-id",
        "retry-after",
        "retry-after-ms",
        "x-ms-retry-after-ms",
    }
)
# Rate-limit headers come in many spellings (`X-RateLimit-Remaining`, `RateLimit-Reset`, ...).
_RATE_LIMIT_HEADER = re.compile(r"(?i)^(?:x-)?rate-?limit(?:-[a-z-]+)?$")
# What else a response keeps: where the operation it started can be polled.
KEPT_RESPONSE_HEADERS = frozenset({"operation-location", "location"})
# A credential in a kept header's URL query, written `***` (as `configuration/redaction.py` does for
# log lines; the read model imports nothing of `configuration`).
_SECRET_IN_QUERY = re.compile(r"(?i)([?&](?:token|secret|access_token|api_key|sig)=)[^&\s\"']*")


def kept_header(name: str) -> bool:
    """Whether the attempt log stores a header of this name (the allowlist)."""
    lowered = name.lower()
    return lowered in KEPT_HEADERS or _RATE_LIMIT_HEADER.match(lowered) is not None


def redact(text: str) -> str:
    """`text` with every query credential's value replaced by `***`."""
    return _SECRET_IN_QUERY.sub(r"\1***", text)


@dataclass
class Attempt:
    """One request and what came of it, as stored."""

    kind: str
    started_at: datetime
    latency_ms: int
    method: str
    host: str
    path: str
    request_headers: dict[str, str]
    status: int | None = None
    response_headers: dict[str, str] = field(default_factory=dict)
    body: str | None = None
    body_truncated: bool = False
    error: str | None = None
    n: int = 0


_CAPTURE: contextvars.ContextVar[list[Attempt] | None] = contextvars.ContextVar(
    "attempt_capture", default=None
)


@contextlib.contextmanager
def capture(kind: str) -> Iterator[list[Attempt]]:
    """Collect the HTTP exchanges `note` sees in this context (a submit's or a poll's)."""
    attempts: list[Attempt] = []
    _kind.set(kind)
    token = _CAPTURE.set(attempts)
    try:
        yield attempts
    finally:
        _CAPTURE.reset(token)


_kind: contextvars.ContextVar[str] = contextvars.ContextVar("attempt_kind", default="submit")


def note(
    method: str,
    url: str,
    request_headers: Any,
    started_at: datetime,
    latency_ms: int,
    *,
    status: int | None = None,
    response_headers: Any = None,
    body: str | None = None,
    error: BaseException | None = None,
) -> None:
    """Record one exchange in the open capture, if any; never raises."""
    attempts = _CAPTURE.get()
    if attempts is None:
        return
    try:
        parts = urlsplit(url)
        kept_body = None if body is None else body[:BODY_LIMIT]
        attempts.append(
            Attempt(
                kind=_kind.get(),
                started_at=started_at,
                latency_ms=latency_ms,
                method=method,
                host=parts.hostname or "",
                path=parts.path or "/",
                request_headers={
                    str(k): str(v)
                    for k, v in dict(request_headers or {}).items()
                    if kept_header(str(k))
                },
                status=status,
                response_headers={
                    str(k).lower(): redact(str(v))
                    for k, v in dict(response_headers or {}).items()
                    if kept_header(str(k)) or str(k).lower() in KEPT_RESPONSE_HEADERS
                },
                body=kept_body,
                body_truncated=body is not None and len(body) > BODY_LIMIT,
                error=None if error is None else type(error).__name__,
            )
        )
    except Exception as err:  # noqa: BLE001 - the log never fails a delivery
        log.warning("attempt not noted: %s", err)


class AttemptLog:
    """One per worker process: `add` hands a request's exchanges over and returns at once; they
    are written in batches, one transaction each, on a thread of their own, so no delivery
    waits on the log. Why: docs/decisions/attempt-log-off-the-path.md"""

    def __init__(self, engine: Engine, max_batch: int = MAX_BATCH) -> None:
        self.engine = engine
        self._max_batch = max_batch
        self._pending: list[tuple[str, Attempt]] = []
        self._writer: asyncio.Task[None] | None = None
        # One thread: one transaction at a time is what gathers the rest into the next.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attempt-log")
        self.transactions = 0  # how well the batching works (the tests check it)
        _LOGS.add(self)

    def add(self, item_id: str, made: Sequence[Attempt]) -> None:
        """Queue the item's attempts for the next batch (in the order they were made)."""
        self._pending.extend((item_id, attempt) for attempt in made)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_pending())

    async def flush(self) -> None:
        """Return once every attempt added so far was written (or its write failed)."""
        while self._writer is not None and not self._writer.done():
            await asyncio.shield(self._writer)

    async def _write_pending(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            batch = self._pending[: self._max_batch]
            del self._pending[: self._max_batch]
            await loop.run_in_executor(self._thread, write_batch, self.engine, batch)
            self.transactions += 1


# The process's logs, for `flush_all` as a worker stops.
_LOGS: weakref.WeakSet[AttemptLog] = weakref.WeakSet()


async def flush_all() -> None:
    """Write what every log of this process still holds: a stopping worker's last requests are
    logged too, once its activities have drained."""
    for attempt_log in list(_LOGS):
        await attempt_log.flush()


def write_attempts(engine: Engine, item_id: str, attempts: list[Attempt]) -> None:
    """The item's attempts, written now (`write_batch`). Never raises."""
    write_batch(engine, [(item_id, attempt) for attempt in attempts])


def write_batch(engine: Engine, batch: Sequence[tuple[str, Attempt]]) -> None:
    """Each attempt as its item's next number, all in one transaction and one INSERT of many
    rows; if that fails (a row refused, or another process numbering the same item's attempt
    at once), each in its own, so one bad row costs only itself. Never raises."""
    try:
        with engine.begin() as connection:
            _insert_many(connection, batch)
        return
    except IntegrityError:
        pass  # another writer took a number first: each again, after the newest
    except Exception as err:  # noqa: BLE001 - the log never fails a delivery
        if len(batch) == 1:
            log.warning("attempt of %s not logged: %s", batch[0][0], err)
            return
        log.warning("batch of %d attempts failed (%s); writing singly", len(batch), err)
    for item_id, attempt in batch:
        for tries_left in reversed(range(_NUMBER_TRIES)):
            try:
                with engine.begin() as connection:
                    _insert(connection, item_id, attempt)
                break
            except IntegrityError as err:
                if not tries_left:
                    log.warning("attempt of %s not logged: %s", item_id, err)
                # Apart from the other writer, which may be taking the next number too.
                time.sleep(random.uniform(0, 0.01))
            except Exception as err:  # noqa: BLE001 - the log never fails a delivery
                log.warning("attempt of %s not logged: %s", item_id, err)
                break


# A batch's statements, built once: building them anew was about a fifth of a small batch's
# write, and a worker writes one or two batches an item (docs/decisions/attempt-log-batches.md).
_LAST_NUMBERS = (
    select(ITEM_ATTEMPTS.c.item_id, func.max(ITEM_ATTEMPTS.c.n))
    .where(ITEM_ATTEMPTS.c.item_id.in_(bindparam("item_ids", expanding=True)))
    .group_by(ITEM_ATTEMPTS.c.item_id)
)
_INSERT_ROWS = insert(ITEM_ATTEMPTS)
_PRUNE = delete(ITEM_ATTEMPTS).where(
    and_(
        ITEM_ATTEMPTS.c.item_id == bindparam("pruned_item"),
        ITEM_ATTEMPTS.c.n <= bindparam("newest_pruned"),
    )
)


def _insert_many(connection: Connection, batch: Sequence[tuple[str, Attempt]]) -> None:
    """The batch numbered after each item's last attempt (one read for all its items), written
    by one statement; prunes an item's oldest beyond `KEEP_PER_ITEM` when a number it takes is a
    tenth. Each item's numbering is held (`_lock_numbering`) until the batch commits.
    Why one statement: docs/decisions/attempt-log-batches.md"""
    item_ids = sorted({item_id for item_id, _ in batch})
    _lock_numbering(connection, item_ids)
    last = dict(connection.execute(_LAST_NUMBERS, {"item_ids": item_ids}).all())
    rows, pruned = [], {}
    for item_id, attempt in batch:
        attempt.n = n = (last.get(item_id) or 0) + 1
        last[item_id] = n
        rows.append({"item_id": item_id, "n": n, **_values(attempt)})
        if n % 10 == 0 and n > KEEP_PER_ITEM:
            pruned[item_id] = n
    connection.execute(_INSERT_ROWS, rows)
    for item_id, n in pruned.items():
        connection.execute(_PRUNE, {"pruned_item": item_id, "newest_pruned": n - KEEP_PER_ITEM})


def _lock_numbering(connection: Connection, item_ids: Sequence[str]) -> None:
    """Hold the numbering of each of `item_ids` (sorted) until the transaction ends. Without it,
    two writers of one item on PostgreSQL (two workers, or a batch and a straggler) both read the
    same last number, and one of them fails on the key, again and again under load: attempts were
    dropped so. On SQLite it is the write lock, taken before the read."""
    lock_scopes(connection, (f"attempts/{item_id}" for item_id in item_ids))


def _values(attempt: Attempt) -> dict[str, Any]:
    return {
        "kind": attempt.kind,
        "started_at": attempt.started_at,
        "latency_ms": attempt.latency_ms,
        "method": attempt.method,
        "host": attempt.host,
        "path": attempt.path,
        "request_headers": attempt.request_headers,
        "status": attempt.status,
        "response_headers": attempt.response_headers,
        "body": attempt.body,
        "body_truncated": attempt.body_truncated,
        "error": attempt.error,
    }


def _insert(connection: Connection, item_id: str, attempt: Attempt) -> None:
    """One INSERT ... SELECT numbering the attempt after the item's last; prunes the item's
    oldest beyond `KEEP_PER_ITEM` every tenth."""
    t = ITEM_ATTEMPTS
    _lock_numbering(connection, [item_id])
    values = _values(attempt)
    next_n = select(func.coalesce(func.max(t.c.n), 0) + 1).where(t.c.item_id == item_id)
    n = connection.execute(
        insert(t)
        .from_select(
            ["item_id", "n", *values],
            select(
                literal(item_id),
                next_n.scalar_subquery(),
                *(literal(v, t.c[k].type) for k, v in values.items()),
            ),
        )
        .returning(t.c.n)
    ).scalar_one()
    attempt.n = n
    if n % 10 == 0 and n > KEEP_PER_ITEM:
        connection.execute(
            delete(t).where(and_(t.c.item_id == item_id, t.c.n <= n - KEEP_PER_ITEM))
        )


def read_attempts(engine: Engine, item_id: str) -> list[dict[str, Any]]:
    """The item's attempts, oldest first, as the API answers them."""
    t = ITEM_ATTEMPTS
    with engine.connect() as connection:
        rows = connection.execute(
            select(t).where(t.c.item_id == item_id).order_by(t.c.n)
        ).mappings()
        return [
            {
                "n": row["n"],
                "kind": row["kind"],
                "started_at": row["started_at"],
                "latency_ms": row["latency_ms"],
                "request": {
                    "method": row["method"],
                    "host": row["host"],
                    "path": row["path"],
                    "headers": row["request_headers"],
                },
                "response": {
                    "status": row["status"],
                    "headers": row["response_headers"],
                    "body": row["body"],
                    "body_truncated": row["body_truncated"],
                },
                "error": row["error"],
            }
            for row in rows
        ]


def erased_at(engine: Engine, item_id: str) -> datetime | None:
    """When the item's payload was erased, if it was."""
    with engine.connect() as connection:
        return connection.execute(
            select(ITEM_ERASURES.c.erased_at).where(ITEM_ERASURES.c.item_id == item_id)
        ).scalar_one_or_none()


def claim_redrive(engine: Engine, item_id: str) -> bool:
    """Mark a failed item whose payload was not erased (nor pruned) `queued` for the redrive
    about to start, in one statement against `readmodel.erasure.erase_item`'s (and retention's):
    True when taken. Its own events follow once the redriven run writes them (`release_redrive`
    gives it back if the redrive is refused)."""
    with engine.begin() as connection:
        claimed = connection.execute(
            update(ITEMS)
            .where(
                ITEMS.c.id == item_id,
                ITEMS.c.status == "failed",
                # Nor pruned: `readmodel.retention` prunes only ended items, in one statement too.
                ITEMS.c.payload_pruned_at.is_(None),
                ~select(ITEM_ERASURES.c.item_id).where(ITEM_ERASURES.c.item_id == item_id).exists(),
            )
            .values(status="queued")
        )
        return bool(claimed.rowcount == 1)


def release_redrive(engine: Engine, item_id: str, last_event_seq: int) -> None:
    """Undo `claim_redrive` for a redrive that did not start (no event of a new run since)."""
    with engine.begin() as connection:
        connection.execute(
            update(ITEMS)
            .where(
                ITEMS.c.id == item_id,
                ITEMS.c.status == "queued",
                ITEMS.c.last_event_seq == last_event_seq,
            )
            .values(status="failed")
        )


def delete_attempts(engine: Engine, item_ids: list[str]) -> None:
    """Drop the attempt log of items being purged from the read model."""
    with engine.begin() as connection:
        connection.execute(delete(ITEM_ATTEMPTS).where(ITEM_ATTEMPTS.c.item_id.in_(item_ids)))
