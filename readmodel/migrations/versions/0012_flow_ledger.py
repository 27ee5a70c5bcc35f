"""Flow control's fleet-wide counts: `flow_permits` and `flow_requests` (`readmodel.permits`).

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "flow_permits",
        sa.Column("scope", sa.String(255), primary_key=True),
        sa.Column("holder", sa.String(255), primary_key=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "flow_requests",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("scope", sa.String(255), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_flow_requests_scope_at", "flow_requests", ["scope", "at"])


def downgrade() -> None:
    op.drop_index("ix_flow_requests_scope_at", table_name="flow_requests")
    op.drop_table("flow_requests")
    op.drop_table("flow_permits")
