"""Retention: when an item's payload was pruned, and the key memory of items whose rows were.

`outbox_items.payload_pruned_at` marks an item whose payload and attempt bodies retention
removed (its view says so, a redrive is refused); the index finds a destination's ended items
not yet pruned, oldest first. `outbox_keys` keeps what answers a repeated key once the item's
row is gone: its status and the digest of its request.

Revision ID: 0019
Revises: 0018
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | Sequence[str] | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "outbox_items", sa.Column("payload_pruned_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.create_index(
        "ix_outbox_items_destination_pruned_finished",
        "outbox_items",
        ["destination", "payload_pruned_at", "finished_at", "id"],
    )
    op.create_table(
        "outbox_keys",
        sa.Column("item_id", sa.String(320), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("payload_hash", sa.String(), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("pruned_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("outbox_keys")
    op.drop_index("ix_outbox_items_destination_pruned_finished", table_name="outbox_items")
    with op.batch_alter_table("outbox_items") as batch:
        batch.drop_column("payload_pruned_at")
