"""Crypto-shredding the aggregate event store, on SQLite and PostgreSQL: events and state are
sealed under the aggregate's own data key (with or without payload keys); erasing deletes it,
and the events stay, in order, their data the `SHREDDED` marker; projectors pass them over, so
a rebuild replays the store without the erased data; the aggregate's next events get a new key."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from durable_outbox_temporal.codec import EncryptionCodec, new_key_setting
from durable_outbox_temporal.contract.aggregate import (
    SHREDDED,
    RecordedEvent,
    StoreEvents,
    is_shredded,
)
from sqlalchemy import Engine, insert, select

from readmodel import aggregates as event_store
from readmodel import data_keys
from readmodel.db import create_schema
from readmodel.models import AGGREGATE_EVENTS, DATA_KEYS
from readmodel.projectors import base as projectors
from tests.readmodel.conftest import EngineFactory
from tests.readmodel.test_projectors import (
    LABOUR,
    MIGRATIONS,
    a_labour,
    drain,
    history,
    store,
)
from tests.readmodel.test_sealing import raw_text, use

T0 = datetime(2026, 11, 28, 9, tzinfo=UTC)


def seat(aggregate_id: str, seq: int, passenger: str) -> StoreEvents:
    return StoreEvents(
        type="flight",
        id=aggregate_id,
        events=[
            RecordedEvent(
                seq,
                "SeatAssigned",
                {"passenger_id": passenger},
                T0 + timedelta(seconds=seq),
                actor="api",
                command_id=f"c{seq}",
            )
        ],
        version=seq,
        state={"seats": {f"{seq}A": passenger}},
        updated_at=T0 + timedelta(seconds=seq),
    )


@pytest.mark.parametrize("sealed", [False, True], ids=["plain", "sealed"])
def test_an_erased_aggregate_keeps_its_events_and_reads_them_as_shredded(
    engine: Engine, sealed: bool
) -> None:
    use(engine, EncryptionCodec.from_setting(new_key_setting("k1")) if sealed else None)
    marker = f"passenger{uuid.uuid4().hex}"
    event_store.store_events(engine, seat("BA1", 1, marker))
    event_store.store_events(engine, seat("BA1", 2, f"{marker}-2"))
    event_store.store_events(engine, seat("BA2", 1, "kept"))

    # Sealed under the aggregate's data key even without payload keys: shredding needs it.
    assert marker not in raw_text(engine)
    assert event_store.events(engine, "flight", "BA1")[0].data == {"passenger_id": marker}
    before = event_store.events(engine, "flight", "BA1")

    erased_at = event_store.erase(engine, "flight", "BA1", T0)

    assert erased_at == T0
    after = event_store.events(engine, "flight", "BA1")
    assert [(e.seq, e.type, e.recorded_at, e.actor, e.command_id) for e in after] == [
        (e.seq, e.type, e.recorded_at, e.actor, e.command_id) for e in before
    ]
    assert [e.data for e in after] == [SHREDDED, SHREDDED]
    record = event_store.get(engine, "flight", "BA1")
    assert record is not None and is_shredded(record.state) and record.version == 2
    with engine.connect() as connection:
        keys = connection.execute(select(DATA_KEYS.c.scope, DATA_KEYS.c.key)).all()
    assert ("agg/flight/BA1", None) in keys  # the key itself is gone
    # Another aggregate is untouched; a repeat answers the first erasure.
    assert event_store.events(engine, "flight", "BA2")[0].data == {"passenger_id": "kept"}
    assert event_store.erase(engine, "flight", "BA1", T0 + timedelta(hours=1)) == T0
    assert event_store.erase(engine, "flight", "never", T0) is None


def test_events_after_an_erasure_get_a_new_key_and_the_old_stay_shredded(engine: Engine) -> None:
    event_store.store_events(engine, seat("BA1", 1, "ada"))
    event_store.erase(engine, "flight", "BA1", T0)

    event_store.store_events(engine, seat("BA1", 2, "bea"))

    assert [e.data for e in event_store.events(engine, "flight", "BA1")] == [
        SHREDDED,
        {"passenger_id": "bea"},
    ]
    record = event_store.get(engine, "flight", "BA1")
    assert record is not None and record.state == {"seats": {"2A": "bea"}}
    with engine.connect() as connection:
        generations = connection.execute(
            select(DATA_KEYS.c.generation, DATA_KEYS.c.key.is_(None))
            .where(DATA_KEYS.c.scope == "agg/flight/BA1")
            .order_by(DATA_KEYS.c.generation)
        ).all()
    assert [tuple(row) for row in generations] == [(1, True), (2, False)]


def test_events_stored_before_data_keys_are_overwritten_by_the_erasure(engine: Engine) -> None:
    with engine.begin() as connection:
        connection.execute(
            insert(AGGREGATE_EVENTS).values(
                aggregate_type="flight",
                aggregate_id="old",
                seq=1,
                type="SeatAssigned",
                data={"passenger_id": "grace"},
                recorded_at=T0,
            )
        )
    assert event_store.events(engine, "flight", "old")[0].data == {"passenger_id": "grace"}

    assert event_store.erase(engine, "flight", "old", T0) == T0

    assert event_store.events(engine, "flight", "old")[0].data == SHREDDED
    assert "grace" not in raw_text(engine)


def test_a_rebuilt_projection_replays_the_store_without_the_erased_aggregate(
    engine_factory: EngineFactory,
) -> None:
    engine = engine_factory("readmodel")
    create_schema(engine, MIGRATIONS)
    a_labour(engine, "lab-1", "m1")
    a_labour(engine, "lab-2", "m1")
    drain(engine)
    kept = [row for row in history(engine, "m1") if row["labour_id"] == "lab-2"]

    event_store.erase(engine, "labour", "lab-1", T0)
    projectors.rebuild(engine, LABOUR)
    drain(engine)

    assert history(engine, "m1") == kept
    status = projectors.status(engine, LABOUR)
    assert (status.status, status.lag, status.consecutive_failures) == ("running", 0, 0)


def test_a_value_under_another_key_row_does_not_open(engine: Engine) -> None:
    with engine.begin() as connection:
        first = data_keys.current_key(connection, "a")
        second = data_keys.current_key(connection, "b")
    sealed = first.seal_json({"x": 1})
    forged = sealed.replace(f"{data_keys.PREFIX}{first.id}:", f"{data_keys.PREFIX}{second.id}:")
    with pytest.raises(ValueError, match="does not authenticate"):
        second.open_json(forged)


def test_an_erasure_removes_what_the_projection_holds_of_the_aggregate_at_once(
    engine_factory: EngineFactory,
) -> None:
    """The labour projection's row of an erased labour goes in the erasure's transaction, with
    no rebuild; the mother's other labour stays, and a later batch brings nothing back. Its
    name is sealed at rest under the payload keys."""
    engine = engine_factory.migrated("readmodel", MIGRATIONS)
    use(engine, EncryptionCodec.from_setting(new_key_setting("k1")))
    marker = f"Ada{uuid.uuid4().hex}"
    store(engine, "lab-1", ("LabourPlanned", {"mother": "m1", "mother_name": marker}))
    a_labour(engine, "lab-2", "m1")
    drain(engine)
    assert {row["mother_name"] for row in history(engine, "m1")} == {marker, "Ada"}
    assert marker not in raw_text(engine)

    event_store.erase(engine, "labour", "lab-1", T0, [LABOUR])
    drain(engine)

    assert [row["labour_id"] for row in history(engine, "m1")] == ["lab-2"]
    assert projectors.status(engine, LABOUR).position > 0  # not restarted


def test_a_projector_without_forget_is_restarted_by_an_erasure(
    engine_factory: EngineFactory,
) -> None:
    engine = engine_factory.migrated("readmodel", MIGRATIONS)
    blunt = dataclasses.replace(LABOUR, forget=None)
    a_labour(engine, "lab-1", "m1")
    a_labour(engine, "lab-2", "m1")
    drain(engine, blunt)

    event_store.erase(engine, "labour", "lab-1", T0, [blunt])

    assert projectors.status(engine, blunt).position == 0
    assert history(engine, "m1") == []
    drain(engine, blunt)
    assert [row["labour_id"] for row in history(engine, "m1")] == ["lab-2"]


def test_an_erasure_of_another_type_leaves_the_projection_alone(
    engine_factory: EngineFactory,
) -> None:
    engine = engine_factory.migrated("readmodel", MIGRATIONS)
    a_labour(engine, "lab-1", "m1")
    drain(engine)
    before = (history(engine, "m1"), projectors.status(engine, LABOUR).position)
    event_store.store_events(engine, seat("BA1", 1, "p1"))

    assert event_store.erase(engine, "flight", "BA1", T0, [LABOUR]) == T0

    assert (history(engine, "m1"), projectors.status(engine, LABOUR).position) == before
