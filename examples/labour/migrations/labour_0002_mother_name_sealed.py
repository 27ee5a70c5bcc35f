"""`labour_history.mother_name` sealed under the payload keys: a text column without a length,
since a sealed value is longer than the 200 characters a name may have.

Rows written before this revision stay plain until a reseal batch seals them (`outbox
payload-keys reseal` or `POST /v1/sealed-values:reseal`, docs/how-to/security.md); the
projector reads both.

Revision ID: labour_0002
Revises: labour_0001
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "labour_0002"
down_revision: str | Sequence[str] | None = "labour_0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "labour_history"


def upgrade() -> None:
    with op.batch_alter_table(TABLE) as table:
        table.alter_column(
            "mother_name", type_=sa.String(), existing_type=sa.String(200), existing_nullable=False
        )


def downgrade() -> None:
    # The older projector reads a name as plain text: rows whose name is sealed go, and the
    # projector starts again from the first event to fill them back (its `apply` skips what a
    # row already holds). Plain rows stay as they are.
    op.execute(sa.text(f"DELETE FROM {TABLE} WHERE mother_name LIKE 'sealed1:%'"))
    op.execute(
        sa.text("UPDATE projector_checkpoints SET position = 0 WHERE name = :name").bindparams(
            name=TABLE
        )
    )
    with op.batch_alter_table(TABLE) as table:
        table.alter_column(
            "mother_name", type_=sa.String(200), existing_type=sa.String(), existing_nullable=False
        )
