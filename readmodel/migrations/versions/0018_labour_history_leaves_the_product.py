"""`labour_history` leaves the product's schema: it is the labour example's table now, made and
migrated by that example's own Alembic branch (`examples/labour/migrations`, label `labour`).

Where the labour type is registered (`AGGREGATE_TYPES`, so its branch is among the version
locations) the table and its rows stay: the branch adopts them. Elsewhere the table is dropped,
with its projector's checkpoint, so registering the type later makes the table anew and projects
every labour event into it again. Revision 0008 still creates the table: a revision a database
has run is history, never rewritten.

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | Sequence[str] | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "labour_history"
# The branch label of the labour example's migrations, which own the table from now on.
OWNER_BRANCH = "labour"


def upgrade() -> None:
    if _owner_configured() or TABLE not in sa.inspect(op.get_bind()).get_table_names():
        return
    op.drop_index("ix_labour_history_mother", table_name=TABLE)
    op.drop_table(TABLE)
    op.execute(
        sa.text("DELETE FROM projector_checkpoints WHERE name = :name").bindparams(name=TABLE)
    )


def downgrade() -> None:
    # Revision 0017 had the table: make it again (empty) where this revision dropped it.
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


def _owner_configured() -> bool:
    """Whether this migration run knows the labour branch (the type is registered)."""
    script = op.get_context().script
    return script is not None and any(
        OWNER_BRANCH in revision.branch_labels for revision in script.walk_revisions()
    )
