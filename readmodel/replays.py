"""Replays in the read model: which item each replayed item replays, and each item's replays.

A link row is written by the replay batch's page right after it enqueues the new item; the
enqueue is idempotent and so is the write, so a retried page leaves one row per replayed item.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, select
from sqlalchemy.dialects import postgresql, sqlite

from readmodel.models import ITEM_ERASURES, ITEM_REPLAYS


@dataclass(frozen=True)
class ReplayLink:
    """One replayed item and its original: both items' ids and keys, and the replay's id."""

    replay_item_id: str
    original_item_id: str
    outbox: str
    replay_id: str
    original_key: str
    replay_key: str
    destination: str
    replayed_at: datetime


def record_replays(engine: Engine, links: Sequence[ReplayLink]) -> None:
    """Write the links; one already written is left as it is."""
    if not links:
        return
    insert = postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert
    statement = insert(ITEM_REPLAYS).on_conflict_do_nothing(index_elements=["replay_item_id"])
    with engine.begin() as connection:
        connection.execute(statement, [link.__dict__ for link in links])


def replay_links(
    engine: Engine, item_id: str, limit: int = 100
) -> tuple[ReplayLink | None, list[ReplayLink]]:
    """Both ways from one item: its link to the original it replays (None if no replay made
    it), and its own replays, oldest first (the first `limit`)."""
    original = select(ITEM_REPLAYS).where(ITEM_REPLAYS.c.replay_item_id == item_id)
    replays = (
        select(ITEM_REPLAYS)
        .where(ITEM_REPLAYS.c.original_item_id == item_id)
        .order_by(ITEM_REPLAYS.c.replayed_at, ITEM_REPLAYS.c.replay_item_id)
        .limit(limit)
    )
    with engine.connect() as connection:
        row = connection.execute(original).mappings().first()
        rows = connection.execute(replays).mappings().all()
    return (None if row is None else ReplayLink(**row)), [ReplayLink(**r) for r in rows]


def erased_among(engine: Engine, item_ids: Collection[str]) -> set[str]:
    """Which of the items had their payload erased (`readmodel/erasure.py`)."""
    if not item_ids:
        return set()
    query = select(ITEM_ERASURES.c.item_id).where(ITEM_ERASURES.c.item_id.in_(sorted(item_ids)))
    with engine.connect() as connection:
        return set(connection.scalars(query))
