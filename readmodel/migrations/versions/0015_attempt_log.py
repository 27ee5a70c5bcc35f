"""The attempt log: each attempt of an item, and the items whose payload was erased.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "item_attempts",
        sa.Column("item_id", sa.String(320), primary_key=True),
        sa.Column("n", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("latency_ms", sa.Integer(), nullable=False),
        sa.Column("method", sa.String(16), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("path", sa.String(2048), nullable=False),
        sa.Column("request_headers", sa.JSON(), nullable=False),
        sa.Column("status", sa.Integer(), nullable=True),
        sa.Column("response_headers", sa.JSON(), nullable=False),
        sa.Column("body", sa.String(), nullable=True),
        sa.Column("body_truncated", sa.Boolean(), nullable=False),
        sa.Column("error", sa.String(255), nullable=True),
    )
    op.create_table(
        "item_erasures",
        sa.Column("item_id", sa.String(320), primary_key=True),
        sa.Column("erased_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("item_erasures")
    op.drop_table("item_attempts")
