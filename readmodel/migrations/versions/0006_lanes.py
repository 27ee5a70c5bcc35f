"""Ordering lanes: `outbox_lanes`, one row per lane with its length, head and halt.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "outbox_lanes",
        sa.Column("id", sa.String(320), primary_key=True),
        sa.Column("outbox", sa.String(100), nullable=False),
        sa.Column("ordering_key", sa.String(200), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("policy", sa.String(16), nullable=False),
        sa.Column("length", sa.Integer(), nullable=False),
        sa.Column("waiting_bytes", sa.Integer(), nullable=False),
        sa.Column("head_key", sa.String(200), nullable=True),
        sa.Column("halted_reason", sa.String(), nullable=True),
        sa.Column("halted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("sent", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.Column("cancelled", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
    )
    op.create_index("ix_outbox_lanes_outbox_key", "outbox_lanes", ["outbox", "ordering_key"])
    op.create_index("ix_outbox_lanes_outbox_status", "outbox_lanes", ["outbox", "status"])


def downgrade() -> None:
    op.drop_index("ix_outbox_lanes_outbox_status", table_name="outbox_lanes")
    op.drop_index("ix_outbox_lanes_outbox_key", table_name="outbox_lanes")
    op.drop_table("outbox_lanes")
