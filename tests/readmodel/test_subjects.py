"""Subjects at rest, on SQLite and PostgreSQL: only a keyed digest is stored, the same for the
same subject from any process, found by outbox in key order; erasing an item drops its link."""

from __future__ import annotations

import hashlib

from sqlalchemy import Engine, select

from readmodel import erasure, subjects
from readmodel.models import ITEM_SUBJECTS
from tests.readmodel.conftest import EngineFactory
from tests.readmodel.test_sealing import raw_text, write_everything


def test_a_subject_is_kept_as_a_keyed_digest_found_in_key_order(
    engine: Engine, engine_factory: EngineFactory
) -> None:
    [ada, bea] = subjects.digests(engine, ["ada@example.com", "bea@example.com"])
    assert ada != bea and len(ada) == 64
    # Keyed: not the plain hash anyone could compute from a guess.
    assert ada != hashlib.sha256(b"ada@example.com").hexdigest()
    subjects.record(
        engine,
        [
            ("outbox/o/k2", "o", "k2", ada),
            ("outbox/o/k1", "o", "k1", ada),
            ("outbox/o/k3", "o", "k3", bea),
            ("outbox/p/k1", "p", "k1", ada),
        ],
    )
    subjects.record(engine, [("outbox/o/k3", "o", "k3", ada)])  # an item keeps its first

    assert "ada@example.com" not in raw_text(engine)
    assert subjects.keys_of(engine, "o", ada, after=None, limit=10) == ["k1", "k2"]
    assert subjects.keys_of(engine, "o", ada, after="k1", limit=10) == ["k2"]
    assert subjects.keys_of(engine, "o", bea, after=None, limit=1) == ["k3"]
    # Another process on the same database digests alike (the index key is in the database).
    [again] = subjects.digests(engine_factory("readmodel"), ["ada@example.com"])
    assert again == ada


def test_erasing_an_item_drops_its_link_to_its_subject(engine: Engine) -> None:
    write_everything(engine, "grace", key="gone")
    [digest] = subjects.digests(engine, ["grace"])
    subjects.record(engine, [("outbox/o/gone", "o", "gone", digest)])

    assert erasure.erase_item(engine, "outbox/o/gone", [str(s) for s in erasure.ERASABLE])

    with engine.connect() as connection:
        assert connection.execute(select(ITEM_SUBJECTS)).all() == []
