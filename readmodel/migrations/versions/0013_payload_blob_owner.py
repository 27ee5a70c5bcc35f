"""Claim checks: `payload_blobs.workflow_id`, the workflow a blob was stored for, so blobs whose
workflow Temporal no longer has can be pruned (`readmodel.payload_store.prune_orphaned_blobs`).

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Blobs stored before have no owner on record: they are kept, as they were.
    with op.batch_alter_table("payload_blobs") as table:
        table.add_column(sa.Column("workflow_id", sa.String(1000), nullable=True))
        table.create_index("ix_payload_blobs_workflow", ["workflow_id", "stored_at"])


def downgrade() -> None:
    with op.batch_alter_table("payload_blobs") as table:
        table.drop_index("ix_payload_blobs_workflow")
        table.drop_column("workflow_id")
