"""Bulk mode's routes: the shard count each owner (an ordering lane, or an unordered item) was
first handed over by, so its later items, repeats and lane verbs reach the shard that holds it
whatever count a process has configured (`readmodel.routes`).

Revision ID: 0026
Revises: 0025
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | Sequence[str] | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "bulk_routes",
        sa.Column("destination", sa.String(63), primary_key=True),
        sa.Column("owner", sa.String(320), primary_key=True),
        sa.Column("shards", sa.Integer(), nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("bulk_routes")
