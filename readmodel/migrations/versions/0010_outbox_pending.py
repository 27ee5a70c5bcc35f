"""The transactional outbox: `outbox_pending`, rows applications insert in their own transaction
for the relay to enqueue.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "outbox_pending",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("outbox", sa.String(100), nullable=False),
        sa.Column("key", sa.String(200), nullable=False),
        sa.Column("destination", sa.String(63), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("ordering_key", sa.String(200), nullable=True),
        sa.Column("not_before", sa.DateTime(timezone=True), nullable=True),
        sa.Column("max_attempts", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("claimed_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("relayed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.String(), nullable=True),
    )
    op.create_index("ix_outbox_pending_status", "outbox_pending", ["status", "id"])
    op.create_index(
        "ix_outbox_pending_key_order",
        "outbox_pending",
        ["outbox", "ordering_key", "status", "id"],
    )


def downgrade() -> None:
    op.drop_table("outbox_pending")
