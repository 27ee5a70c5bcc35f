"""Read-model tables: `outbox_items` (one row per item) and `outbox_events` (append-only log)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Column, DateTime, Dialect, Index, Integer, UniqueConstraint
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel


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


class OutboxItemBase(SQLModel):
    """Fields every view of an item shares."""

    id: str = Field(primary_key=True, max_length=320)
    outbox: str = Field(max_length=100)
    key: str = Field(max_length=200)
    destination: str = Field(max_length=63)
    status: str = Field(max_length=16)
    attempts: int = 0
    max_attempts: int = 0
    last_error: str | None = None
    next_attempt_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    operation_url: str | None = None
    poll_count: int = 0
    # Never NULL: it is the keyset the item lists page on.
    created_at: datetime = Field(sa_type=UTCDateTime, nullable=False)
    updated_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    ordering_key: str | None = None
    payload_hash: str | None = None
    provider_message_id: str | None = None


class OutboxItem(OutboxItemBase, table=True):
    """One row per item, upserted on every transition; `version` is the newest event seq applied."""

    __tablename__ = "outbox_items"
    __table_args__ = (
        Index("ix_outbox_items_outbox_created", "outbox", "created_at", "id"),
        Index("ix_outbox_items_outbox_status", "outbox", "status", "created_at", "id"),
        Index("ix_outbox_items_outbox_destination", "outbox", "destination", "created_at"),
    )

    # none_as_null: a projection without payload must be SQL NULL so COALESCE keeps the stored one.
    payload: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON(none_as_null=True)))
    version: int = 0


class OutboxItemPublic(OutboxItemBase):
    """An item as the API lists it."""

    payload: dict[str, Any] | None = None


class OutboxEventBase(SQLModel):
    """One transition of one item."""

    item_id: str = Field(max_length=320)
    outbox: str = Field(max_length=100)
    seq: int
    type: str = Field(max_length=32)
    status: str = Field(max_length=16)
    at: datetime = Field(sa_type=UTCDateTime, nullable=False)
    attempt: int = 0
    detail: str | None = None


class OutboxEvent(OutboxEventBase, table=True):
    """Append-only; `id` is the outbox-wide cursor live clients resume from (`?since=`)."""

    __tablename__ = "outbox_events"
    __table_args__ = (
        UniqueConstraint("item_id", "seq", name="uq_outbox_events_item_seq"),
        Index("ix_outbox_events_outbox_id", "outbox", "id"),
        # Without AUTOINCREMENT SQLite would reuse the id of a deleted newest row, and a tailer
        # already past that id would never see the new event.
        {"sqlite_autoincrement": True},
    )

    # BigInteger on PostgreSQL, but SQLite only auto-increments an INTEGER PRIMARY KEY.
    id: int | None = Field(
        default=None,
        sa_column=Column(
            BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True
        ),
    )


class OutboxEventPublic(OutboxEventBase):
    """An event as the API and the live stream show it."""

    id: int
