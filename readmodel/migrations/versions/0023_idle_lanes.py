"""Retention prunes the rows of ordering lanes idle past the longest item retention: an index on
`(updated_at, id)` of idle lanes, for its pages oldest first (`readmodel.retention`).

Revision ID: 0023
Revises: 0022
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | Sequence[str] | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

IDLE = sa.text("status = 'idle'")


def upgrade() -> None:
    op.create_index(
        "ix_outbox_lanes_idle",
        "outbox_lanes",
        ["updated_at", "id"],
        postgresql_where=IDLE,
        sqlite_where=IDLE,
    )


def downgrade() -> None:
    op.drop_index("ix_outbox_lanes_idle", table_name="outbox_lanes")
