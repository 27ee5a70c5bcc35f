"""Debounce: an item's debounce key, and the item that carried it when its window closed
(status `superseded`).

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Items enqueued before had no debounce: both stay NULL for them.
    with op.batch_alter_table("outbox_items") as table:
        table.add_column(sa.Column("debounce_key", sa.String(200), nullable=True))
        table.add_column(sa.Column("superseded_by", sa.String(320), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("outbox_items") as table:
        table.drop_column("superseded_by")
        table.drop_column("debounce_key")
