"""The read model as `create_schema` built it before migrations: items and their events.

Databases from that time have exactly these tables and no `alembic_version`; `create_schema`
stamps them with this revision instead of running it.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "outbox_items",
        sa.Column("id", sa.String(320), primary_key=True),
        sa.Column("outbox", sa.String(100), nullable=False),
        sa.Column("key", sa.String(200), nullable=False),
        sa.Column("destination", sa.String(63), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.String(), nullable=True),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("operation_url", sa.String(), nullable=True),
        sa.Column("poll_count", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ordering_key", sa.String(), nullable=True),
        sa.Column("payload_hash", sa.String(), nullable=True),
        sa.Column("provider_message_id", sa.String(), nullable=True),
        sa.Column("payload", sa.JSON(), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
    )
    op.create_index(
        "ix_outbox_items_outbox_created", "outbox_items", ["outbox", "created_at", "id"]
    )
    op.create_index(
        "ix_outbox_items_outbox_destination",
        "outbox_items",
        ["outbox", "destination", "created_at"],
    )
    op.create_index(
        "ix_outbox_items_outbox_status", "outbox_items", ["outbox", "status", "created_at", "id"]
    )
    op.create_table(
        "outbox_events",
        sa.Column("item_id", sa.String(320), nullable=False),
        sa.Column("outbox", sa.String(100), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("detail", sa.String(), nullable=True),
        # SQLite only auto-increments an INTEGER PRIMARY KEY.
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.UniqueConstraint("item_id", "seq", name="uq_outbox_events_item_seq"),
        # Without AUTOINCREMENT SQLite would reuse the id of a deleted newest row.
        sqlite_autoincrement=True,
    )
    op.create_index("ix_outbox_events_outbox_id", "outbox_events", ["outbox", "id"])


def downgrade() -> None:
    op.drop_table("outbox_events")
    op.drop_table("outbox_items")
