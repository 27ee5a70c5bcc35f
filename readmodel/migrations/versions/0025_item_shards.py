"""A bulk-mode item's row says the shard count it was routed by (`OutboxItemView.shards`), so its
cancels and delivery reports reach the shard that holds it whatever count is configured when
they come. Rows from before have none: they go by the count configured.

Revision ID: 0025
Revises: 0024
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | Sequence[str] | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("outbox_items") as table:
        table.add_column(sa.Column("shards", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("outbox_items") as table:
        table.drop_column("shards")
