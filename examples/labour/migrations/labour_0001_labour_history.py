"""The labour example's `labour_history` table, on the example's own branch (`labour`).

A database from before the examples left the product has the table already (the product's
revision 0008 made it): this revision adopts it, rows and all. Anywhere else it makes the table,
and forgets the projector's checkpoint, so the projector fills it from the first event.

Revision ID: labour_0001
Revises: (the branch's first; needs the product's 0008, which may have made the table)
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "labour_0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = ("labour",)
depends_on: str | Sequence[str] | None = "0008"

TABLE = "labour_history"
# The product's revision from which the product no longer holds the table.
PRODUCT_LETS_GO = "0018"


def upgrade() -> None:
    if TABLE in sa.inspect(op.get_bind()).get_table_names():
        return
    op.create_table(
        TABLE,
        sa.Column("labour_id", sa.String(200), primary_key=True),
        sa.Column("mother", sa.String(64), nullable=False),
        sa.Column("mother_name", sa.String(200), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("contractions", sa.Integer(), nullable=False),
        sa.Column("updates", sa.Integer(), nullable=False),
        sa.Column("announcements", sa.Integer(), nullable=False),
        sa.Column("subscribers", sa.JSON(), nullable=False),
        sa.Column("planned_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_seq", sa.Integer(), nullable=False),
    )
    op.create_index("ix_labour_history_mother", TABLE, ["mother", "labour_id"])
    op.execute(
        sa.text("DELETE FROM projector_checkpoints WHERE name = :name").bindparams(name=TABLE)
    )


def downgrade() -> None:
    # Below 0018 the table is the product's (0008 drops it on its own way down): leave it.
    if not _product_let_go():
        return
    op.drop_index("ix_labour_history_mother", table_name=TABLE)
    op.drop_table(TABLE)
    op.execute(
        sa.text("DELETE FROM projector_checkpoints WHERE name = :name").bindparams(name=TABLE)
    )


def _product_let_go() -> bool:
    context = op.get_context()
    script = context.script
    if script is None:
        return True
    applied = {
        revision.revision
        for head in context.get_current_heads()
        for revision in script.revision_map.iterate_revisions(head, "base")
    }
    return PRODUCT_LETS_GO in applied
