"""Claim checks: a Temporal external-storage driver that keeps large payloads in this
database, so workflow histories carry only a reference.

The SDK's `ExternalStorage` (in the data converter) hands every payload above its threshold to
`store` after the codec has encrypted it, and puts the returned claim in the history; `retrieve`
gives the bytes back to any client or worker that reads the history. Blobs are keyed by the
digest of their bytes, so storing the same payload twice (a retried call, a replay) is one row.

Each blob records the workflow it was stored for, and when. A blob is read by the run of that
workflow open when it was stored (a signal's, a query's) or the run started right after (a start's
or a continue-as-new's input). Once Temporal no longer has any such run (its retention has ended,
or its start never happened), nothing can read the blob: `prune_orphaned_blobs` deletes it. A
long-lived workflow id (a bulk shard, an aggregate, a lane) keeps existing in Temporal through its
runs, so its blobs go run by run, as each run's retention ends, not when the id is gone. A blob
two workflows share, or one stored for an activity, records none and stays.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, delete, insert, select, update
from sqlalchemy.exc import IntegrityError
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.converter import (
    ExternalStorage,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
    StorageDriverWorkflowInfo,
)
from temporalio.service import RPCError, RPCStatusCode

from readmodel.models import PAYLOAD_BLOBS

CLAIM_KEY = "digest"
# A blob younger than this is never pruned: its workflow's start may still be on its way.
PRUNE_GRACE = timedelta(hours=1)
# Workflows asked about at a time by the pruner.
PRUNE_BATCH = 500

log = logging.getLogger("outbox.claim_checks")


class MissingPayload(LookupError):
    """A claim names a blob this database does not hold (another database, or deleted)."""


class SqlPayloadStore(StorageDriver):
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def name(self) -> str:
        return "sql"

    async def store(
        self, context: StorageDriverStoreContext, payloads: Sequence[Payload]
    ) -> list[StorageDriverClaim]:
        owner = context.target.id if isinstance(context.target, StorageDriverWorkflowInfo) else None
        return await asyncio.to_thread(self._store, list(payloads), owner)

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        return await asyncio.to_thread(self._retrieve, list(claims))

    def _store(self, payloads: list[Payload], owner: str | None) -> list[StorageDriverClaim]:
        claims = []
        for payload in payloads:
            data = payload.SerializeToString()
            digest = hashlib.sha256(data).hexdigest()
            try:
                with self._engine.begin() as connection:
                    connection.execute(
                        insert(PAYLOAD_BLOBS).values(
                            digest=digest,
                            data=data,
                            size=len(data),
                            stored_at=datetime.now(UTC),
                            workflow_id=owner,
                        )
                    )
            except IntegrityError:
                # Stored before: same bytes, same digest. For another workflow too, it is theirs
                # both, and no one workflow's end may prune it.
                with self._engine.begin() as connection:
                    connection.execute(
                        update(PAYLOAD_BLOBS)
                        .where(
                            PAYLOAD_BLOBS.c.digest == digest,
                            PAYLOAD_BLOBS.c.workflow_id.is_distinct_from(owner),
                        )
                        .values(workflow_id=None)
                    )
            claims.append(StorageDriverClaim(claim_data={CLAIM_KEY: digest}))
        return claims

    def _retrieve(self, claims: list[StorageDriverClaim]) -> list[Payload]:
        digests = [claim.claim_data[CLAIM_KEY] for claim in claims]
        with self._engine.connect() as connection:
            rows = connection.execute(
                select(PAYLOAD_BLOBS.c.digest, PAYLOAD_BLOBS.c.data).where(
                    PAYLOAD_BLOBS.c.digest.in_(set(digests))
                )
            ).all()
        found = {row.digest: row.data for row in rows}
        missing = [digest for digest in digests if digest not in found]
        if missing:
            raise MissingPayload(f"payload blob(s) not in this database: {', '.join(missing)}")
        return [Payload.FromString(found[digest]) for digest in digests]


def claim_checks(engine: Engine | None, threshold_bytes: int) -> ExternalStorage | None:
    """The converter's external storage for payloads above `threshold_bytes` (None: off)."""
    if engine is None or threshold_bytes <= 0:
        return None
    return ExternalStorage(
        drivers=[SqlPayloadStore(engine)], payload_size_threshold=threshold_bytes
    )


@dataclass(frozen=True)
class TemporalRuns:
    """What the pruner asks Temporal about a workflow id (`temporal_runs`)."""

    # The start of its current (latest) run; None when Temporal has no run of it.
    current_start: Callable[[str], Awaitable[datetime | None]]
    # Whether Temporal still has a run of it (open, or closed within its retention) that
    # started at or before the given time.
    started_by: Callable[[str, datetime], Awaitable[bool]]


async def prune_orphaned_blobs(
    engine: Engine,
    runs: TemporalRuns,
    *,
    grace: timedelta = PRUNE_GRACE,
    batch: int = PRUNE_BATCH,
) -> int:
    """Delete the blobs, older than `grace`, that no run Temporal still has can read (asking
    about `batch` workflows at a time); how many blobs went.

    A blob stored at T is read by the run open at T or the one started within `grace` after
    it. So an owner Temporal has no run of loses them all; one whose current run started before
    the oldest (within `grace`) keeps them all; and one with later runs (a continued-as-new
    workflow) loses those stored more than `grace` before its oldest retained run started: a
    search over their times, one visibility query each step."""
    cutoff = datetime.now(UTC) - grace
    deleted = 0
    after: str | None = None
    while True:
        owners = await asyncio.to_thread(_owners_before, engine, cutoff, batch, after)
        for owner in owners:
            times = await asyncio.to_thread(_stored_times, engine, owner, cutoff)
            through = await _unread_through(runs, owner, times, grace)
            if through is not None:
                deleted += await asyncio.to_thread(_delete_owned, engine, owner, through)
        if len(owners) < batch:
            break
        after = owners[-1]
    if deleted:
        log.info("pruned %d payload blob(s) no run Temporal has can read", deleted)
    return deleted


async def _unread_through(
    runs: TemporalRuns, owner: str, times: list[datetime], grace: timedelta
) -> datetime | None:
    """The latest of `times` (ascending) up to which the owner's blobs can go; None: none."""
    if not times:
        return None
    current = await runs.current_start(owner)
    if current is None:
        return times[-1]
    if current <= times[0] + grace:
        return None  # the current run may read every one of them
    # The first time with a run started within `grace` after it: that blob and later stay.
    low, high = 0, len(times)
    while low < high:
        middle = (low + high) // 2
        if await runs.started_by(owner, times[middle] + grace):
            high = middle
        else:
            low = middle + 1
    return times[low - 1] if low else None


def _owners_before(engine: Engine, cutoff: datetime, limit: int, after: str | None) -> list[str]:
    """The next `limit` owners (in order, after `after`) of blobs stored before `cutoff`."""
    query = select(PAYLOAD_BLOBS.c.workflow_id).where(
        PAYLOAD_BLOBS.c.workflow_id.is_not(None), PAYLOAD_BLOBS.c.stored_at < cutoff
    )
    if after is not None:
        query = query.where(PAYLOAD_BLOBS.c.workflow_id > after)
    with engine.connect() as connection:
        return list(
            connection.execute(
                query.group_by(PAYLOAD_BLOBS.c.workflow_id)
                .order_by(PAYLOAD_BLOBS.c.workflow_id)
                .limit(limit)
            ).scalars()
        )


def _stored_times(engine: Engine, owner: str, cutoff: datetime) -> list[datetime]:
    """When the owner's blobs older than `cutoff` were stored, ascending (UTC)."""
    with engine.connect() as connection:
        found = connection.execute(
            select(PAYLOAD_BLOBS.c.stored_at)
            .where(PAYLOAD_BLOBS.c.workflow_id == owner, PAYLOAD_BLOBS.c.stored_at < cutoff)
            .distinct()
            .order_by(PAYLOAD_BLOBS.c.stored_at)
        ).scalars()
        # SQLite gives the time back without its zone: it was stored in UTC.
        return [at if at.tzinfo else at.replace(tzinfo=UTC) for at in found]


def _delete_owned(engine: Engine, owner: str, through: datetime) -> int:
    with engine.begin() as connection:
        result = connection.execute(
            delete(PAYLOAD_BLOBS).where(
                PAYLOAD_BLOBS.c.workflow_id == owner, PAYLOAD_BLOBS.c.stored_at <= through
            )
        )
        return result.rowcount


def temporal_runs(client: Client) -> TemporalRuns:
    """`TemporalRuns` from `client`: the current run by a describe, earlier runs by a
    visibility query (only for owners with runs after their blobs)."""

    async def current_start(workflow_id: str) -> datetime | None:
        try:
            description = await client.get_workflow_handle(workflow_id).describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return None
            raise
        return description.start_time

    async def started_by(workflow_id: str, at: datetime) -> bool:
        if '"' in workflow_id or "\\" in workflow_id:
            return True  # not a query's literal: its blobs are kept
        moment = at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        query = f'WorkflowId = "{workflow_id}" AND StartTime <= "{moment}"'
        async for _ in client.list_workflows(query, limit=1, page_size=1):
            return True
        return False

    return TemporalRuns(current_start, started_by)


async def prune_forever(engine: Engine, client: Client, every: timedelta = PRUNE_GRACE) -> None:
    """Prune orphaned blobs every `every` until cancelled (a worker runs it beside its relay)."""
    while True:
        try:
            await prune_orphaned_blobs(engine, temporal_runs(client))
        except Exception as err:  # the database or Temporal is down: next time
            log.warning("payload blob prune failed: %s", err)
        await asyncio.sleep(every.total_seconds())
