"""Rotation that finishes, on SQLite and PostgreSQL: after a new key goes in front, resealing
page by page moves every stored value (older key or plain) under it, the counts per key say
when the old key holds nothing, and the old key can then be removed with every row still
reading; a value under a key no longer configured is named, left as it is, and does not stop
the walk."""

from __future__ import annotations

import pytest
from durable_outbox_temporal.codec import EncryptionCodec, new_key_setting
from sqlalchemy import Engine

from readmodel import aggregates, attempts, store
from readmodel.reseal import NoPayloadKeys, SealedCounts, reseal_page, sealed_counts, sealed_tables
from tests.readmodel.test_sealing import K1, K1_SETTING, use, write_everything

K0 = EncryptionCodec.from_setting(new_key_setting("k0"))
K2_SETTING = new_key_setting("k2")
K2_THEN_K1 = EncryptionCodec.from_setting(f"{K2_SETTING},{K1_SETTING}")
K2 = EncryptionCodec.from_setting(K2_SETTING)
TABLES = sealed_tables()


def reseal_all(engine: Engine, limit: int) -> tuple[int, list[str], int]:
    """Walk every table as a batch does; the values resealed, those unreadable, the pages."""
    table, cursor, pages, resealed, unreadable = None, None, 0, 0, []
    while True:
        page = reseal_page(engine, TABLES, table, cursor, limit)
        pages += 1
        resealed += page.resealed
        unreadable += page.unreadable
        if page.next_table is None:
            return resealed, unreadable, pages
        assert (page.next_table, page.next_cursor) != (table, cursor), "the walk went nowhere"
        table, cursor = page.next_table, page.next_cursor


def counts(engine: Engine) -> SealedCounts:
    keys = K2_THEN_K1.value_keys()
    return sealed_counts(engine, TABLES, keys.key_ids)


def assert_everything_reads(engine: Engine, key: str, marker: str) -> None:
    record = store.get_item(engine, f"outbox/o/{key}")
    assert record is not None and record.payload == {
        "to": f"{marker}@example.com",
        "subject": marker,
    }
    assert record.view.recipients[0].address == f"{marker}@example.com"
    assert store.item_events(engine, f"outbox/o/{key}")[1].detail == f"{marker}@example.com: ok"
    [attempt] = attempts.read_attempts(engine, f"outbox/o/{key}")
    assert attempt["request"]["headers"] == {"x-echo": marker}
    assert aggregates.events(engine, "flight", f"f-{key}")[0].data == {"passenger": marker}


def test_a_reseal_moves_every_value_under_the_new_key_so_the_old_one_can_go(
    engine: Engine,
) -> None:
    write_everything(engine, "plain", key="before")  # written before any key was set
    write_everything(engine, "under-k1", key="one", codec=K1)
    write_everything(engine, "under-k2", key="two", codec=K2_THEN_K1)
    use(engine, K2_THEN_K1)
    before = counts(engine)
    assert before.by_key["k1"] > 0 and before.by_key["k2"] > 0 and before.plain > 0

    # Two rows a page: the composite keys (attempts, aggregates) page by their tuple.
    resealed, unreadable, pages = reseal_all(engine, limit=2)

    after = counts(engine)
    assert unreadable == []
    assert resealed == before.by_key["k1"] + before.plain
    assert after == SealedCounts(
        by_key={"k2": sum(before.by_key.values()) + before.plain, "k1": 0}, other=0, plain=0
    )
    assert pages > len(TABLES)
    # A second walk finds nothing left to do.
    assert reseal_all(engine, limit=500)[0] == 0

    use(engine, K2)  # k1 removed
    for key, marker in (("before", "plain"), ("one", "under-k1"), ("two", "under-k2")):
        assert_everything_reads(engine, key, marker)


def test_a_value_under_a_key_gone_is_named_and_left_and_the_walk_goes_on(engine: Engine) -> None:
    write_everything(engine, "lost", key="lost", codec=K0)
    write_everything(engine, "kept", key="kept", codec=K1)
    use(engine, K2_THEN_K1)  # k0 is gone

    resealed, unreadable, _ = reseal_all(engine, limit=3)

    assert resealed > 0 and unreadable
    assert all("'k0'" in reason for reason in unreadable)
    assert any(reason.startswith("outbox_items.payload ['outbox/o/lost']") for reason in unreadable)
    after = counts(engine)
    assert after.by_key["k1"] == 0 and after.other == len(unreadable)
    assert_everything_reads(engine, "kept", "kept")


def test_resealing_needs_keys(engine: Engine) -> None:
    write_everything(engine, "plain", key="before")
    with pytest.raises(NoPayloadKeys, match="PAYLOAD_KEYS"):
        reseal_page(engine, TABLES, None, None, 10)
