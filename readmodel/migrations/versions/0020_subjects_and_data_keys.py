"""Erasure by subject and crypto-shredding: the subject digests items were enqueued with, and
the data keys aggregates' events and state are sealed under.

Revision ID: 0020
Revises: 0019
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | Sequence[str] | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "item_subjects",
        sa.Column("item_id", sa.String(320), primary_key=True),
        sa.Column("outbox", sa.String(100), nullable=False),
        sa.Column("key", sa.String(200), nullable=False),
        sa.Column("subject_digest", sa.String(64), nullable=False),
    )
    op.create_index(
        "ix_item_subjects_subject", "item_subjects", ["outbox", "subject_digest", "key"]
    )
    op.create_table(
        "data_keys",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("scope", sa.String(1000), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("shredded_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("scope", "generation", name="uq_data_keys_scope_generation"),
        sqlite_autoincrement=True,
    )


def downgrade() -> None:
    op.drop_table("data_keys")
    op.drop_index("ix_item_subjects_subject", table_name="item_subjects")
    op.drop_table("item_subjects")
