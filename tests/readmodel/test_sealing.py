"""The read model at rest: with payload keys, a caller's data is sealed in every column that
carries it (and the transactional outbox's rows), reads back plain, and stays findable by the
columns that are searched; rows written before the keys still read; a value whose key is gone
raises an error naming the key. On SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from durable_outbox_temporal.codec import EncryptionCodec, new_key_setting
from durable_outbox_temporal.contract.aggregate import RecordedEvent, StoreEvents
from durable_outbox_temporal.contract.item import (
    ItemEvent,
    ItemEventType,
    ItemProjection,
    ItemStatus,
    Recipient,
    RecipientStatus,
)
from durable_outbox_temporal.contract.sealed_columns import seal_with
from durable_outbox_temporal.contract.sealing import (
    PREFIX,
    SealedValueError,
    SealedValueKeyMissing,
    sealed_with,
)
from durable_outbox_temporal.transactional import enqueue_in
from sqlalchemy import Engine, inspect, select, text
from sqlalchemy.orm import Session

from readmodel import aggregates, attempts, erasure, store
from readmodel.models import OUTBOX_PENDING
from service.relay import Relay
from tests.readmodel.test_store import T0, view

K1_SETTING = new_key_setting("k1")
K1 = EncryptionCodec.from_setting(K1_SETTING)
# A new key in front of the same k1.
K2_THEN_K1 = EncryptionCodec.from_setting(f"{new_key_setting('k2')},{K1_SETTING}")


def write_everything(
    engine: Engine, marker: str, key: str = "k", codec: EncryptionCodec | None = None
) -> None:
    """An item (payload and its digest, a recipient, an event detail naming it, an error), its
    attempt, an aggregate's event and state, and a relay row (`enqueue_in` with `codec`, as the
    application's own process has it): each carrying `marker`."""
    use(engine, codec)
    address = f"{marker}@example.com"
    sent = ItemEvent(2, ItemEventType.DELIVERY_REPORT, ItemStatus.SENT, T0, 1, f"{address}: ok")
    recipient = Recipient(address, RecipientStatus.DELIVERED, f"250 {marker}", T0)
    store.apply_projection(
        engine,
        ItemProjection(
            view(key, 1, ItemStatus.QUEUED, payload_hash=f"sha256:{marker}"),
            [ItemEvent(1, ItemEventType.ENQUEUED, ItemStatus.QUEUED, T0)],
            T0,
            payload={"to": address, "subject": marker},
        ),
    )
    store.apply_projection(
        engine,
        ItemProjection(
            view(
                key,
                2,
                ItemStatus.SENT,
                recipients=[recipient],
                last_error=f"bounced {address}",
                provider_message_id=f"msg-{key}",
                payload_hash=f"sha256:{marker}",
            ),
            [sent],
        ),
    )
    attempts.write_attempts(
        engine,
        f"outbox/o/{key}",
        [
            attempts.Attempt(
                kind="submit",
                started_at=T0,
                latency_ms=3,
                method="POST",
                host="provider.example",
                path="/emails",
                request_headers={"x-echo": marker},
                status=202,
                response_headers={"location": f"https://provider.example/{marker}"},
                body=f'{{"to": "{address}"}}',
            )
        ],
    )
    aggregates.store_events(
        engine,
        StoreEvents(
            type="flight",
            id=f"f-{key}",
            events=[RecordedEvent(1, "SeatAssigned", {"passenger": marker}, T0)],
            version=1,
            state={"seats": {"1A": marker}},
            updated_at=T0,
        ),
    )
    with Session(engine) as session, session.begin():
        enqueue_in(
            session,
            outbox="o",
            destination="d",
            payload={"to": address},
            key=key,
            keys=codec,
        )


def use(engine: Engine, codec: EncryptionCodec | None) -> None:
    """Seal with `codec`'s keys from now on, as a process started with them does."""
    seal_with(engine, None if codec is None else codec.value_keys())


def raw_text(engine: Engine) -> str:
    """Every row of every table as the database holds it (no column type applied)."""
    dump = []
    with engine.connect() as connection:
        for table in inspect(connection).get_table_names():
            for row in connection.execute(text(f'SELECT * FROM "{table}"')):
                dump.append(repr(tuple(row)))
    return "\n".join(dump)


def database_files(engine: Engine) -> bytes:
    """The SQLite file and its write-ahead log, as a disk would hold them."""
    database = engine.url.database
    assert database
    return b"".join(
        Path(path).read_bytes() for path in (database, f"{database}-wal") if Path(path).exists()
    )


def test_a_callers_data_is_sealed_at_rest_and_reads_back_plain(engine: Engine) -> None:
    marker = f"marker{uuid.uuid4().hex}"

    write_everything(engine, marker, codec=K1)

    at_rest = raw_text(engine)
    assert marker not in at_rest
    assert f"{PREFIX}k1:" in at_rest
    if engine.dialect.name == "sqlite":
        assert marker.encode() not in database_files(engine)
    record = store.get_item(engine, "outbox/o/k")
    assert record is not None
    assert record.payload == {"to": f"{marker}@example.com", "subject": marker}
    assert record.view.recipients[0].address == f"{marker}@example.com"
    assert record.view.recipients[0].detail == f"250 {marker}"
    assert record.view.last_error == f"bounced {marker}@example.com"
    assert record.view.payload_hash == f"sha256:{marker}"
    assert store.item_events(engine, "outbox/o/k")[1].detail == f"{marker}@example.com: ok"
    [attempt] = attempts.read_attempts(engine, "outbox/o/k")
    assert attempt["request"]["headers"] == {"x-echo": marker}
    assert attempt["response"]["body"] == f'{{"to": "{marker}@example.com"}}'
    assert aggregates.events(engine, "flight", "f-k")[0].data == {"passenger": marker}
    state = aggregates.get(engine, "flight", "f-k")
    assert state is not None and state.state == {"seats": {"1A": marker}}
    with engine.connect() as connection:
        [pending] = connection.execute(select(OUTBOX_PENDING.c.payload)).scalars()
    assert pending == {"to": f"{marker}@example.com"}


def test_the_searched_columns_stay_searchable(engine: Engine) -> None:
    write_everything(engine, "m1", key="alpha-1", codec=K1)
    write_everything(engine, "m2", key="beta-1", codec=K1)

    by_status, _ = store.list_items(engine, "o", status="sent", destination="d", key_prefix="alp")

    assert [record.view.key for record in by_status] == ["alpha-1"]
    assert by_status[0].payload == {"to": "m1@example.com", "subject": "m1"}
    # The report lookup finds its item by the plain message id and reads the sealed addresses.
    assert store.items_by_message_id(engine, "d", ["msg-beta-1"]) == {
        "msg-beta-1": store.ReportTarget("outbox/o/beta-1", None, frozenset({"m2@example.com"}))
    }
    assert store.counts_by_status(engine, "o") == {"sent": 2}


def test_rows_written_before_the_keys_still_read_and_new_ones_are_sealed(engine: Engine) -> None:
    write_everything(engine, "before", key="old")
    assert "before@example.com" in raw_text(engine)

    write_everything(engine, "after", key="new", codec=K1)

    old, new = store.get_item(engine, "outbox/o/old"), store.get_item(engine, "outbox/o/new")
    assert old is not None and old.payload == {"to": "before@example.com", "subject": "before"}
    assert new is not None and new.payload == {"to": "after@example.com", "subject": "after"}
    assert "after@example.com" not in raw_text(engine)


def test_a_new_key_in_front_seals_new_values_and_the_old_one_still_opens(engine: Engine) -> None:
    write_everything(engine, "under-k1", key="one", codec=K1)

    write_everything(engine, "under-k2", key="two", codec=K2_THEN_K1)

    with engine.connect() as connection:
        stored = dict(connection.execute(text("SELECT key, payload FROM outbox_items")).all())
    assert {key: sealed_with(_json_text(value)) for key, value in stored.items()} == {
        "one": "k1",
        "two": "k2",
    }
    one = store.get_item(engine, "outbox/o/one")
    assert one is not None and one.payload == {"to": "under-k1@example.com", "subject": "under-k1"}


def _json_text(value: object) -> object:
    # A JSON column holds a sealed value as a JSON string: SQLite's driver gives its text.
    if isinstance(value, str) and value.startswith('"'):
        return value.strip('"')
    return value


def test_a_value_whose_key_is_gone_raises_naming_the_key(engine: Engine) -> None:
    write_everything(engine, "lost", key="lost", codec=K2_THEN_K1)

    use(engine, K1)  # k2 is gone
    with pytest.raises(SealedValueKeyMissing) as missing:
        store.get_item(engine, "outbox/o/lost")
    assert missing.value.key_id == "k2" and "PAYLOAD_KEYS" in str(missing.value)

    use(engine, None)  # no keys at all
    with pytest.raises(SealedValueKeyMissing, match="'k2'"):
        store.item_events(engine, "outbox/o/lost")

    use(engine, EncryptionCodec.from_setting(new_key_setting("k2")))  # another key named k2
    with pytest.raises(SealedValueError, match="does not authenticate"):
        aggregates.get(engine, "flight", "f-lost")


def test_erasing_blanks_the_sealed_bodies(engine: Engine) -> None:
    write_everything(engine, "erase-me", key="gone", codec=K1)

    assert erasure.erase_item(engine, "outbox/o/gone", {"sent"}, T0 + timedelta(days=1))

    record = store.get_item(engine, "outbox/o/gone")
    assert record is not None and record.payload is None
    [attempt] = attempts.read_attempts(engine, "outbox/o/gone")
    assert attempt["response"]["body"] is None and attempt["request"]["headers"] == {}


class RecordingOutbox:
    """Stands in for `OutboxClient.enqueue`: what the relay hands over."""

    def __init__(self) -> None:
        self.enqueued: list[tuple[str, dict[str, Any]]] = []

    async def enqueue(self, outbox: str, destination: str, payload: Any, **fields: Any) -> None:
        self.enqueued.append((fields["key"], payload))


async def test_the_relay_opens_its_rows_and_one_whose_key_is_gone_waits(engine: Engine) -> None:
    for key, codec in (("under-k2", K2_THEN_K1), ("under-k1", K1)):
        with Session(engine) as session, session.begin():
            enqueue_in(
                session, outbox="o", destination="d", payload={"n": key}, key=key, keys=codec
            )
    use(engine, K1)  # the relay's process lacks k2
    outbox = RecordingOutbox()

    settled = await Relay(outbox, engine).relay_once()  # type: ignore[arg-type]

    assert settled == 1 and outbox.enqueued == [("under-k1", {"n": "under-k1"})]
    with engine.connect() as connection:
        waiting = connection.execute(
            select(OUTBOX_PENDING.c.status, OUTBOX_PENDING.c.last_error).where(
                OUTBOX_PENDING.c.key == "under-k2"
            )
        ).one()
    assert waiting.status == "pending" and "'k2'" in waiting.last_error
