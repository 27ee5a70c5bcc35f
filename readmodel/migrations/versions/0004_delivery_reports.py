"""Delivery reports: `outbox_items.recipients` and `.delivery`, and the indexes that find an
item by its provider message id and list items by delivery outcome.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A constant default: neither SQLite nor PostgreSQL (11+) rewrites the table to add it, and
    # items sent before reports existed read back with no recipients.
    op.add_column(
        "outbox_items",
        sa.Column("recipients", sa.JSON(), nullable=False, server_default=sa.text("'[]'")),
    )
    op.add_column("outbox_items", sa.Column("delivery", sa.String(16), nullable=True))
    op.create_index(
        "ix_outbox_items_outbox_delivery",
        "outbox_items",
        ["outbox", "delivery", "created_at", "id"],
    )
    op.create_index("ix_outbox_items_provider_message_id", "outbox_items", ["provider_message_id"])


def downgrade() -> None:
    op.drop_index("ix_outbox_items_provider_message_id", table_name="outbox_items")
    op.drop_index("ix_outbox_items_outbox_delivery", table_name="outbox_items")
    op.drop_column("outbox_items", "delivery")
    op.drop_column("outbox_items", "recipients")
