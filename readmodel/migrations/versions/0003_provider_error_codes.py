"""The provider's error code: `outbox_items.last_error_code` and `outbox_events.error_code`.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# Nullable columns with no default: an ADD COLUMN that neither SQLite nor PostgreSQL rewrites
# the table for; rows written before it simply have no code.
def upgrade() -> None:
    op.add_column("outbox_items", sa.Column("last_error_code", sa.String(), nullable=True))
    op.add_column("outbox_events", sa.Column("error_code", sa.String(), nullable=True))


def downgrade() -> None:
    # SQLite drops a column natively since 3.35.
    op.drop_column("outbox_events", "error_code")
    op.drop_column("outbox_items", "last_error_code")
