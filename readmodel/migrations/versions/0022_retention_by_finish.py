"""Retention finds a destination's ended items by when they ended: an index on
`(destination, finished_at, id)` of ended items, in place of 0019's
`(destination, payload_pruned_at, finished_at, id)`.

PostgreSQL could not read 0019's index in `(finished_at, id)` order under `payload_pruned_at IS
NULL` (not an equality for ordering), so each page of a million ended items was a sequential scan
and a sort (docs/decisions/retention-pages.md). Pages now go on from the last item of the page
before (`readmodel/retention.py`), an index range scan each.

Revision ID: 0022
Revises: 0021
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | Sequence[str] | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ENDED = sa.text("finished_at IS NOT NULL")


def upgrade() -> None:
    op.create_index(
        "ix_outbox_items_destination_finished",
        "outbox_items",
        ["destination", "finished_at", "id"],
        postgresql_where=ENDED,
        sqlite_where=ENDED,
    )
    op.drop_index("ix_outbox_items_destination_pruned_finished", table_name="outbox_items")


def downgrade() -> None:
    op.create_index(
        "ix_outbox_items_destination_pruned_finished",
        "outbox_items",
        ["destination", "payload_pruned_at", "finished_at", "id"],
    )
    op.drop_index("ix_outbox_items_destination_finished", table_name="outbox_items")
