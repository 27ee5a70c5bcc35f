"""Subjects: the person (or account) a caller says an item is about, attached at enqueue so
that everything about them can be erased by one request (`EraseBatch`).

A subject identifier is personal data (an email address, a customer id), so the read model
keeps only a keyed digest of it: HMAC-SHA256 under the subject index's own data key
(`readmodel.data_keys`, sealed under the payload keys). Equal subjects give equal digests, so
a subject's items are found by it; nobody can read the subject back, nor test a guess without
the key. The key is its own, not a payload key: rotating the payload keys must not change
the digests already stored.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from sqlalchemy import Engine, select
from sqlalchemy.dialects import postgresql, sqlite

from readmodel import data_keys
from readmodel.models import ITEM_SUBJECTS

SUBJECT_INDEX_SCOPE = "subject-index"


def digests(engine: Engine, subjects: Iterable[str]) -> list[str]:
    """Each subject's keyed digest, in order (the index key made on first use)."""
    with engine.begin() as connection:
        key = data_keys.current_key(connection, SUBJECT_INDEX_SCOPE).raw
    return [
        hmac.new(key, subject.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()
        for subject in subjects
    ]


def record(engine: Engine, subjects: Iterable[tuple[str, str, str, str]]) -> None:
    """Attach (item id, outbox, key, subject digest) rows; an item keeps its first subject."""
    rows = [
        {"item_id": item_id, "outbox": outbox, "key": key, "subject_digest": digest}
        for item_id, outbox, key, digest in subjects
    ]
    if not rows:
        return
    insert = postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert
    with engine.begin() as connection:
        connection.execute(
            insert(ITEM_SUBJECTS).on_conflict_do_nothing(index_elements=["item_id"]), rows
        )


def keys_of(
    engine: Engine, outbox: str, digest: str, *, after: str | None, limit: int
) -> list[str]:
    """The keys of the outbox's items attached to the subject, in key order after `after`."""
    query = (
        select(ITEM_SUBJECTS.c.key)
        .where(ITEM_SUBJECTS.c.outbox == outbox, ITEM_SUBJECTS.c.subject_digest == digest)
        .order_by(ITEM_SUBJECTS.c.key)
        .limit(limit)
    )
    if after is not None:
        query = query.where(ITEM_SUBJECTS.c.key > after)
    with engine.connect() as connection:
        return list(connection.execute(query).scalars())
