"""The transactional outbox's table: the rows an application writes and the relay reads.

It is shared by `durable_outbox_temporal.transactional.enqueue_in` (in the application's own
database) and the service's read model (`readmodel.models`, whose migrations create it), so both
sides agree on every column. Needs SQLAlchemy (the package's `sqlalchemy` extra).
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Dialect,
    Index,
    Integer,
    MetaData,
    String,
    Table,
)
from sqlalchemy.types import TypeDecorator

from durable_outbox_temporal.contract.limits import (
    MAX_DESTINATION_LENGTH,
    MAX_KEY_LENGTH,
    MAX_OUTBOX_LENGTH,
)
from durable_outbox_temporal.contract.sealed_columns import SealedJSON


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored in UTC and read back time-zone aware, on SQLite as on PostgreSQL."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        # Naive values are UTC by convention (Temporal and the API only produce aware ones).
        value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        # SQLite keeps text without an offset: all-UTC text sorts and compares chronologically.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# Rows an application inserts in its own transaction
# (`durable_outbox_temporal.transactional.enqueue_in`), relayed to Temporal by `service.relay`.
OUTBOX_PENDING_TABLE = Table(
    "outbox_pending",
    MetaData(),
    Column(
        "id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("outbox", String(MAX_OUTBOX_LENGTH), nullable=False),
    Column("key", String(MAX_KEY_LENGTH), nullable=False),
    Column("destination", String(MAX_DESTINATION_LENGTH), nullable=False),
    # Sealed under the payload keys: `enqueue_in` seals it, the relay opens it.
    Column("payload", SealedJSON(), nullable=False),
    Column("ordering_key", String(MAX_KEY_LENGTH), nullable=True),
    Column("not_before", UTCDateTime(), nullable=True),
    Column("max_attempts", Integer(), nullable=True),
    Column("created_at", UTCDateTime(), nullable=False),
    # A relay's lease: it is enqueueing the row until then (another may take it after).
    Column("claimed_until", UTCDateTime(), nullable=True),
    Column("relayed_at", UTCDateTime(), nullable=True),
    # "pending", "relayed", or "refused" (the enqueue was refused for good: last_error says why).
    Column("status", String(16), nullable=False),
    Column("attempts", Integer(), nullable=False),
    Column("last_error", String(), nullable=True),
    Index("ix_outbox_pending_status", "status", "id"),
    Index("ix_outbox_pending_key_order", "outbox", "ordering_key", "status", "id"),
)
