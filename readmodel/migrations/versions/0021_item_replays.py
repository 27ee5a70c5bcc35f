"""Replays: `item_replays` links each replayed item to its original (`readmodel.replays`).

Revision ID: 0021
Revises: 0020
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | Sequence[str] | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "item_replays",
        sa.Column("replay_item_id", sa.String(320), primary_key=True),
        sa.Column("original_item_id", sa.String(320), nullable=False),
        sa.Column("outbox", sa.String(100), nullable=False),
        sa.Column("replay_id", sa.String(32), nullable=False),
        sa.Column("original_key", sa.String(200), nullable=False),
        sa.Column("replay_key", sa.String(200), nullable=False),
        sa.Column("destination", sa.String(63), nullable=False),
        sa.Column("replayed_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_item_replays_original", "item_replays", ["original_item_id", "replayed_at"])


def downgrade() -> None:
    op.drop_index("ix_item_replays_original", table_name="item_replays")
    op.drop_table("item_replays")
