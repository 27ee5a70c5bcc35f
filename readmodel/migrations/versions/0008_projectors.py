"""Async projectors: `projector_checkpoints` (position and health per projector) and the
`labour_history` read model.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "projector_checkpoints",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("consecutive_failures", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.String(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("rebuilt_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_table(
        "labour_history",
        sa.Column("labour_id", sa.String(200), primary_key=True),
        sa.Column("mother", sa.String(64), nullable=False),
        sa.Column("mother_name", sa.String(200), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("contractions", sa.Integer(), nullable=False),
        sa.Column("updates", sa.Integer(), nullable=False),
        sa.Column("announcements", sa.Integer(), nullable=False),
        sa.Column("subscribers", sa.JSON(), nullable=False),
        sa.Column("planned_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_seq", sa.Integer(), nullable=False),
    )
    op.create_index("ix_labour_history_mother", "labour_history", ["mother", "labour_id"])


def downgrade() -> None:
    op.drop_index("ix_labour_history_mother", table_name="labour_history")
    op.drop_table("labour_history")
    op.drop_table("projector_checkpoints")
