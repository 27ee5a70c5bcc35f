"""Claim checks: a Temporal external-storage driver that keeps large payloads in this
database, so workflow histories carry only a reference.

The SDK's `ExternalStorage` (in the data converter) hands every payload above its threshold to
`store` after the codec has encrypted it, and puts the returned claim in the history; `retrieve`
gives the bytes back to any client or worker that reads the history. Blobs are keyed by the
digest of their bytes, so storing the same payload twice (a retried call, a replay) is one row.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import Engine, insert, select
from sqlalchemy.exc import IntegrityError
from temporalio.api.common.v1 import Payload
from temporalio.converter import (
    ExternalStorage,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
)

from readmodel.models import PAYLOAD_BLOBS

CLAIM_KEY = "digest"


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
        return await asyncio.to_thread(self._store, list(payloads))

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        return await asyncio.to_thread(self._retrieve, list(claims))

    def _store(self, payloads: list[Payload]) -> list[StorageDriverClaim]:
        claims = []
        for payload in payloads:
            data = payload.SerializeToString()
            digest = hashlib.sha256(data).hexdigest()
            try:
                with self._engine.begin() as connection:
                    connection.execute(
                        insert(PAYLOAD_BLOBS).values(
                            digest=digest, data=data, size=len(data), stored_at=datetime.now(UTC)
                        )
                    )
            except IntegrityError:
                pass  # stored before: same bytes, same digest
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
