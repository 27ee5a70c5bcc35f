"""The dashboard's health strip: an index for a destination's items ended per minute
(`readmodel/activity.py`; without it each tile scanned the whole table: 48 ms at 200,000 items
on PostgreSQL, 19 ms with it, and growing with the table).

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0017"
down_revision: str | Sequence[str] | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_outbox_items_destination_status_finished",
        "outbox_items",
        ["destination", "status", "finished_at"],
    )


def downgrade() -> None:
    op.drop_index("ix_outbox_items_destination_status_finished", table_name="outbox_items")
