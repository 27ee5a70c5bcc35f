"""`outbox_items.version` becomes `last_event_seq`, the name of the view field it holds.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# A plain RENAME COLUMN (SQLite has had it since 3.25) keeps the data, the indexes and the
# table's options, which a batch-mode copy of the table would have to restate.
def upgrade() -> None:
    op.alter_column("outbox_items", "version", new_column_name="last_event_seq")


def downgrade() -> None:
    op.alter_column("outbox_items", "last_event_seq", new_column_name="version")
