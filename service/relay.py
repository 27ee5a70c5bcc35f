"""The relay of the transactional outbox: committed `outbox_pending` rows become items.

Each pass claims a batch of the oldest pending rows with a short lease (on PostgreSQL with
`FOR UPDATE SKIP LOCKED`, so several relays share the work without waiting on each other),
enqueues each under its key through `OutboxClient` (a repeat is the same item: a relay killed
between the enqueue and marking the row only makes the next one find the item already there),
then marks it relayed. Rows of one ordering key go in commit order: a row is claimable only
when no earlier row of its key is still pending, so two relays never append one key's rows out
of order. A row the outbox refuses for good (an unknown destination, a different request under
the same key) is marked `refused` with the reason, and its key's later rows go on. So is a row
whose enqueue fails in any other way (a bug, a payload the client cannot encode) on each of
`max_attempts` passes, one lease apart: it would otherwise block its key for ever. A row sealed
under a payload key this relay does not have waits, a lease apart, for the key to be configured:
the row is kept, never refused for it, and the log names the key.

New rows wake a relay at once on PostgreSQL (LISTEN on the channel `enqueue_in` notifies on
commit); it also polls, the only way on SQLite (where one relay runs). Relayed rows are pruned
after the retention. `python -m service.relay` runs one alone; the worker runs one by default.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from durable_outbox_temporal import OutboxClient, OutboxError, TemporalUnavailable
from durable_outbox_temporal.contract.sealed_columns import keys_of, open_json
from durable_outbox_temporal.contract.sealing import SealedValueError
from durable_outbox_temporal.transactional import NOTIFY_CHANNEL
from sqlalchemy import (
    JSON,
    Engine,
    Select,
    and_,
    bindparam,
    delete,
    exists,
    func,
    select,
    type_coerce,
    update,
)
from sqlalchemy.engine import RowMapping
from sqlalchemy.sql.elements import BindParameter

from readmodel.db import in_thread
from readmodel.models import OUTBOX_PENDING
from readmodel.routes import ReadModelRoutes

log = logging.getLogger("outbox.relay")

LEASE = timedelta(seconds=30)
# Relayed rows are kept for days (`retention`): deleting the expired ones once a minute is
# enough, where every pass (four a second) cost an idle relay a statement each time.
PRUNE_EVERY_S = 60.0
# Passes a row may fail in an unexpected way (not a refusal, not Temporal unavailable) before it
# is refused with the reason: a few minutes of leases, enough for a passing fault to clear.
MAX_ATTEMPTS = 10


@dataclass
class RelayStats:
    """The relay's backlog: rows waiting and the oldest one's age (the relay lag)."""

    pending: int
    refused: int
    oldest_pending_age_s: float


class Relay:
    def __init__(
        self,
        outbox: OutboxClient,
        engine: Engine,
        *,
        batch: int = 100,
        poll_interval_s: float = 0.25,
        retention: timedelta = timedelta(days=7),
        max_attempts: int = MAX_ATTEMPTS,
    ) -> None:
        self._outbox = outbox
        self._engine = engine
        self._batch = batch
        self._poll_interval_s = poll_interval_s
        self._retention = retention
        self._max_attempts = max_attempts
        self._wake = asyncio.Event()
        self.relayed = 0
        self._pruned_at = -PRUNE_EVERY_S  # monotonic: the first pass prunes
        # Built once: building it took most of an idle pass's CPU (1.9 ms of SQLAlchemy
        # constructs a pass, four passes a second; docs/decisions/relay-polling-interval.md).
        self._claimable = _claimable(batch, postgres=self._postgres)

    async def run(self) -> None:
        """Relay until cancelled: a pass whenever woken or every poll interval."""
        listener = asyncio.create_task(self._listen()) if self._postgres else None
        try:
            while True:
                # Cleared before the pass, not after: a commit's wake-up that comes during the
                # pass then brings another pass at once, rather than being lost until the next
                # poll (a minute in a test whose relay polls that seldom).
                self._wake.clear()
                try:
                    moved = await self.relay_once()
                    if time.monotonic() - self._pruned_at >= PRUNE_EVERY_S:
                        await in_thread(self._prune)
                        self._pruned_at = time.monotonic()
                except Exception as err:  # the database or Temporal is down: try again soon
                    log.warning("relay pass failed: %s", err)
                    moved = 0
                if moved >= self._batch:
                    continue  # more are waiting
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._poll_interval_s)
        finally:
            if listener is not None:
                # Awaited, so its connection is closed here: a task only cancelled would leave
                # it to the garbage collector once the loop has gone.
                listener.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await listener

    async def relay_once(self) -> int:
        """One pass: claim, enqueue and mark up to a batch of rows; how many were settled.

        A pass holds at most one row per ordering key (see `_claim`), so its rows are enqueued
        at once: no two of one key race."""
        rows = await in_thread(self._claim)
        settled = await asyncio.gather(*(self._relay_row(row) for row in rows))
        return sum(settled)

    async def _relay_row(self, row: RowMapping) -> bool:
        """Enqueue one claimed row and mark it; whether it is settled (relayed or refused)."""
        try:
            payload = open_json(row["payload"], keys_of(self._engine))
        except SealedValueError as err:
            log.warning("relay: row %s waits for its payload key: %s", row["id"], err)
            await in_thread(self._note_failure, row["id"], str(err))
            return False
        try:
            await self._outbox.enqueue(
                row["outbox"],
                row["destination"],
                payload,
                key=row["key"],
                ordering_key=row["ordering_key"],
                not_before=row["not_before"],
                max_attempts=row["max_attempts"],
            )
        except TemporalUnavailable as err:
            # Nothing is lost: the row is claimable again at once.
            log.warning("relay: Temporal unavailable (%s); row %s later", err, row["id"])
            await in_thread(self._release, row["id"], str(err))
            return False
        except OutboxError as err:
            await in_thread(self._mark, row["id"], "refused", str(err))
            return True
        except Exception as err:
            error = f"{type(err).__name__}: {err}"
            # The claim counted this pass in the row, not in the mapping it read.
            attempts = row["attempts"] + 1
            if attempts >= self._max_attempts:
                log.error("relay: row %s refused after %d attempts: %s", row["id"], attempts, error)
                reason = f"gave up after {attempts} attempts: {error}"
                await in_thread(self._mark, row["id"], "refused", reason)
                return True
            # Claimable again once its lease ends: a pass later, not in a tight loop.
            log.warning("relay: row %s failed (attempt %d): %s", row["id"], attempts, error)
            await in_thread(self._note_failure, row["id"], error)
            return False
        await in_thread(self._mark, row["id"], "relayed", None)
        self.relayed += 1
        return True

    def stats(self) -> RelayStats:
        return relay_stats(self._engine)

    @property
    def _postgres(self) -> bool:
        return self._engine.dialect.name == "postgresql"

    def _claim(self) -> list[RowMapping]:
        now = datetime.now(UTC)
        with self._engine.begin() as connection:
            rows = connection.execute(self._claimable, {"now": now}).mappings().all()
            if rows:
                connection.execute(
                    update(OUTBOX_PENDING)
                    .where(OUTBOX_PENDING.c.id.in_([row["id"] for row in rows]))
                    .values(claimed_until=now + LEASE, attempts=OUTBOX_PENDING.c.attempts + 1)
                )
        return list(rows)

    def _mark(self, row_id: int, status: str, error: str | None) -> None:
        with self._engine.begin() as connection:
            connection.execute(
                update(OUTBOX_PENDING)
                .where(OUTBOX_PENDING.c.id == row_id)
                .values(status=status, relayed_at=datetime.now(UTC), last_error=error)
            )

    def _note_failure(self, row_id: int, error: str) -> None:
        with self._engine.begin() as connection:
            connection.execute(
                update(OUTBOX_PENDING).where(OUTBOX_PENDING.c.id == row_id).values(last_error=error)
            )

    def _release(self, row_id: int, error: str) -> None:
        with self._engine.begin() as connection:
            connection.execute(
                update(OUTBOX_PENDING)
                .where(OUTBOX_PENDING.c.id == row_id)
                .values(claimed_until=None, last_error=error)
            )

    def _prune(self) -> None:
        cutoff = datetime.now(UTC) - self._retention
        with self._engine.begin() as connection:
            connection.execute(
                delete(OUTBOX_PENDING).where(
                    OUTBOX_PENDING.c.status == "relayed", OUTBOX_PENDING.c.relayed_at < cutoff
                )
            )

    async def _listen(self) -> None:
        """Wake the relay on each commit of new rows (PostgreSQL's LISTEN/NOTIFY)."""
        import psycopg

        url = self._engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    # A pass now: rows committed before the LISTEN took effect woke nobody.
                    self._wake.set()
                    async for _ in conn.notifies():
                        self._wake.set()
            except Exception as err:  # polling carries on meanwhile
                log.warning("relay: LISTEN failed (%s); polling", err)
                await asyncio.sleep(self._poll_interval_s)


def _claimable(batch: int, *, postgres: bool) -> Select[Any]:
    """A pass's claimable rows (`now` bound at execution): pending, not leased by a live relay,
    and first of its ordering key; on PostgreSQL locked, skipping rows another relay holds."""
    earlier = OUTBOX_PENDING.alias("earlier")
    first_of_key = ~exists().where(
        and_(
            earlier.c.outbox == OUTBOX_PENDING.c.outbox,
            earlier.c.ordering_key == OUTBOX_PENDING.c.ordering_key,
            earlier.c.status == "pending",
            earlier.c.id < OUTBOX_PENDING.c.id,
        )
    )
    # The payload as stored: opened row by row (`_relay_row`), so one row whose key is missing
    # holds up no other.
    columns = [c for c in OUTBOX_PENDING.c if c.name != "payload"]
    stored_payload = type_coerce(OUTBOX_PENDING.c.payload, JSON()).label("payload")
    now: BindParameter[datetime] = bindparam("now", type_=OUTBOX_PENDING.c.claimed_until.type)
    query = (
        select(*columns, stored_payload)
        .where(
            OUTBOX_PENDING.c.status == "pending",
            (OUTBOX_PENDING.c.claimed_until.is_(None)) | (OUTBOX_PENDING.c.claimed_until < now),
            (OUTBOX_PENDING.c.ordering_key.is_(None)) | first_of_key,
        )
        .order_by(OUTBOX_PENDING.c.id)
        .limit(batch)
    )
    if postgres:
        query = query.with_for_update(skip_locked=True, of=OUTBOX_PENDING)
    return query


def relay_stats(engine: Engine, outbox: str | None = None) -> RelayStats:
    """The relay's backlog, of one outbox or of all."""
    where = [] if outbox is None else [OUTBOX_PENDING.c.outbox == outbox]
    with engine.connect() as connection:
        counts: dict[Any, int] = dict(
            connection.execute(
                select(OUTBOX_PENDING.c.status, func.count())
                .where(*where)
                .group_by(OUTBOX_PENDING.c.status)
            ).all()
        )
        oldest = connection.execute(
            select(func.min(OUTBOX_PENDING.c.created_at)).where(
                OUTBOX_PENDING.c.status == "pending", *where
            )
        ).scalar()
    age = 0.0
    if oldest is not None:
        oldest = oldest if oldest.tzinfo else oldest.replace(tzinfo=UTC)
        age = max((datetime.now(UTC) - oldest).total_seconds(), 0.0)
    return RelayStats(
        pending=counts.get("pending", 0),
        refused=counts.get("refused", 0),
        oldest_pending_age_s=age,
    )


async def run_alone() -> None:
    """`python -m service.relay`: one relay with the worker's settings, until SIGINT/SIGTERM."""
    import signal

    from durable_outbox_temporal import connect
    from durable_outbox_temporal.codec import codec_from_environment
    from durable_outbox_temporal.contract.sealed_columns import seal_with

    from configuration.destinations import load_destinations
    from configuration.settings import get_settings
    from readmodel.db import create_schema, make_engine

    settings = get_settings()
    engine = make_engine(settings.database_url)
    codec = codec_from_environment()
    seal_with(engine, None if codec is None else codec.value_keys())
    create_schema(engine)
    client = await connect()
    outbox = OutboxClient(
        client,
        load_destinations(settings.outbox_config),
        settings.workflow_task_queue,
        routes=ReadModelRoutes(engine),
    )
    relay = Relay(
        outbox,
        engine,
        poll_interval_s=settings.relay_poll_interval_s,
        retention=timedelta(seconds=settings.relay_retention_s),
        max_attempts=settings.relay_max_attempts,
    )
    task = asyncio.create_task(relay.run())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    log.info("relay running alone")
    with contextlib.suppress(asyncio.CancelledError):
        await task
    engine.dispose()


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    asyncio.run(run_alone())
