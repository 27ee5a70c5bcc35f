"""Claim checks: a Temporal external-storage driver that keeps large payloads in this
database, so workflow histories carry only a reference.

The SDK's `ExternalStorage` (in the data converter) hands every payload above its threshold to
`store` after the codec has encrypted it, and puts the returned claim in the history; `retrieve`
gives the bytes back to any client or worker that reads the history. Blobs are keyed by the
digest of their bytes, so storing the same payload twice (a retried call, a replay) is one row.

Each blob records the workflow it was stored for. Once Temporal no longer has that workflow
(its retention has ended, or its start never happened), nothing can read the blob:
`prune_orphaned_blobs` deletes it. A blob two workflows share, or one stored for an activity,
records none and stays.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Sequence
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


async def prune_orphaned_blobs(
    engine: Engine,
    workflow_exists: Callable[[str], Awaitable[bool]],
    *,
    grace: timedelta = PRUNE_GRACE,
    batch: int = PRUNE_BATCH,
) -> int:
    """Delete the blobs, older than `grace`, of every workflow Temporal no longer has (asking
    about `batch` workflows at a time); how many blobs went."""
    cutoff = datetime.now(UTC) - grace
    deleted = 0
    after: str | None = None
    while True:
        owners = await asyncio.to_thread(_owners_before, engine, cutoff, batch, after)
        gone = [owner for owner in owners if not await workflow_exists(owner)]
        if gone:
            deleted += await asyncio.to_thread(_delete_owned, engine, gone, cutoff)
        if len(owners) < batch:
            break
        after = owners[-1]
    if deleted:
        log.info("pruned %d payload blob(s) of workflows Temporal no longer has", deleted)
    return deleted


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


def _delete_owned(engine: Engine, owners: list[str], cutoff: datetime) -> int:
    with engine.begin() as connection:
        result = connection.execute(
            delete(PAYLOAD_BLOBS).where(
                PAYLOAD_BLOBS.c.workflow_id.in_(owners), PAYLOAD_BLOBS.c.stored_at < cutoff
            )
        )
        return result.rowcount


def temporal_has(client: Client) -> Callable[[str], Awaitable[bool]]:
    """Whether Temporal still has a workflow of that id (any run, open or closed)."""

    async def exists(workflow_id: str) -> bool:
        try:
            await client.get_workflow_handle(workflow_id).describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return False
            raise
        return True

    return exists


async def prune_forever(engine: Engine, client: Client, every: timedelta = PRUNE_GRACE) -> None:
    """Prune orphaned blobs every `every` until cancelled (a worker runs it beside its relay)."""
    while True:
        try:
            await prune_orphaned_blobs(engine, temporal_has(client))
        except Exception as err:  # the database or Temporal is down: next time
            log.warning("payload blob prune failed: %s", err)
        await asyncio.sleep(every.total_seconds())
