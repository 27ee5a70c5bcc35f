"""Dead letters: `outbox_discards` (discarded failures, kept for audit) and an index that lists
an outbox's failed items by when they failed.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "outbox_discards",
        sa.Column("item_id", sa.String(320), primary_key=True),
        sa.Column("outbox", sa.String(100), nullable=False),
        sa.Column("last_event_seq", sa.Integer(), nullable=False),
        sa.Column("reason", sa.String(), nullable=False),
        sa.Column("discarded_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index(
        "ix_outbox_items_outbox_status_finished",
        "outbox_items",
        ["outbox", "status", "finished_at", "id"],
    )


def downgrade() -> None:
    op.drop_index("ix_outbox_items_outbox_status_finished", table_name="outbox_items")
    op.drop_table("outbox_discards")
