"""An idle aggregate's run stores what it carries and ends (passivation): the carry, sealed under
the aggregate's data key, and when it was stored, on its `aggregates` row; the next run loads
them (`readmodel.aggregates.resume`, docs/decisions/aggregate-passivation.md).

Revision ID: 0024
Revises: 0023
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | Sequence[str] | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("aggregates") as table:
        table.add_column(sa.Column("carry", sa.JSON(), nullable=True))
        table.add_column(sa.Column("passivated_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("aggregates") as table:
        table.drop_column("passivated_at")
        table.drop_column("carry")
