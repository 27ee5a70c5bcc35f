"""Lanes in bulk shards: `outbox_lanes.destination`, and a version that outlives a lane's end.

A lane's version now starts from the microseconds since the epoch when it (re)started, so a lane
that ended idle and started again moves its row forward: it needs 64 bits.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("outbox_lanes") as batch:
        batch.add_column(sa.Column("destination", sa.String(63), nullable=True))
        batch.alter_column(
            "version", existing_type=sa.Integer(), type_=sa.BigInteger(), existing_nullable=False
        )


def downgrade() -> None:
    with op.batch_alter_table("outbox_lanes") as batch:
        batch.alter_column(
            "version", existing_type=sa.BigInteger(), type_=sa.Integer(), existing_nullable=False
        )
        batch.drop_column("destination")
