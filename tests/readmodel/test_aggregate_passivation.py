"""An idle aggregate's carry on its `aggregates` row, on SQLite and PostgreSQL: stored only at
the stored version, sealed under the aggregate's data key, loaded by its next run; a carry older
than the store gives way to the stored state; an erasure takes the carry with the state."""

from __future__ import annotations

import uuid
from datetime import timedelta

from durable_outbox_temporal.contract.aggregate import (
    AggregateCarry,
    CommandRequest,
    EffectRecord,
    EffectStatus,
    PassivateAggregate,
    RejectedCommand,
)
from sqlalchemy import Engine

from readmodel import aggregates as event_store
from tests.readmodel.test_crypto_shredding import T0, seat
from tests.readmodel.test_sealing import raw_text


def carry_of(version: int, passenger: str) -> AggregateCarry:
    return AggregateCarry(
        state={"seats": {f"{version}A": passenger}},
        version=version,
        views={"assignments": version},
        seen_commands={"c1": 1, f"c{version}": version},
        seen_command_hashes={"c1": "ab" * 16},
        rejected=[
            RejectedCommand(
                request=CommandRequest(name="assign_seat", payload={"seat": "9Z"}),
                error_type="InvalidCommand",
                message=f"no seat 9Z for {passenger}",
                at=T0,
            )
        ],
        updated_at=T0 + timedelta(seconds=version),
        effects=[
            EffectRecord(
                key="flight:BA1:1:ping",
                event_seq=1,
                name="ping",
                kind="call_provider",
                action={"payload": {"to": passenger}},
                created_at=T0,
                status=EffectStatus.DONE,
                executions=1,
                finished_at=T0,
            )
        ],
    )


def passivate(engine: Engine, version: int, passenger: str) -> bool:
    return event_store.passivate(
        engine,
        PassivateAggregate(
            type="flight",
            id="BA1",
            carry=carry_of(version, passenger),
            passivated_at=T0 + timedelta(hours=1),
        ),
    )


def test_the_carry_is_stored_sealed_and_resumed_whole(engine: Engine) -> None:
    marker = f"passenger{uuid.uuid4().hex}"
    event_store.store_events(engine, seat("BA1", 1, "ada"))
    event_store.store_events(engine, seat("BA1", 2, marker))

    assert passivate(engine, 2, marker)

    resumed = event_store.resume(engine, "flight", "BA1")
    assert resumed is not None and not resumed.erased
    assert resumed.carry == carry_of(2, marker)
    assert resumed.version == 2
    # The rejected command's message and the effect's action name the passenger: sealed.
    assert marker not in raw_text(engine)
    record = event_store.get(engine, "flight", "BA1")
    assert record is not None and record.passivated_at == T0 + timedelta(hours=1)
    assert event_store.resume(engine, "flight", "never") is None


def test_a_carry_goes_only_with_the_state_it_leads_to(engine: Engine) -> None:
    event_store.store_events(engine, seat("BA1", 1, "ada"))

    # A run's carry at a version the store does not hold is not written.
    assert not passivate(engine, 2, "bea")
    assert not passivate_unknown(engine)
    stored = event_store.resume(engine, "flight", "BA1")
    assert stored is not None and stored.carry is None and stored.version == 1

    # One stored, then newer events (a run that went on and ended otherwise): the store holds.
    assert passivate(engine, 1, "ada")
    event_store.store_events(engine, seat("BA1", 2, "bea"))
    resumed = event_store.resume(engine, "flight", "BA1")
    assert resumed is not None and resumed.carry is None
    assert (resumed.version, resumed.state, resumed.erased) == (
        2,
        {"seats": {"2A": "bea"}},
        False,
    )


def passivate_unknown(engine: Engine) -> bool:
    return event_store.passivate(
        engine,
        PassivateAggregate(type="flight", id="nobody", carry=carry_of(1, "x"), passivated_at=T0),
    )


def test_an_erasure_takes_the_carry_with_the_state(engine: Engine) -> None:
    event_store.store_events(engine, seat("BA1", 1, "ada"))
    assert passivate(engine, 1, "ada")

    event_store.erase(engine, "flight", "BA1", T0)

    resumed = event_store.resume(engine, "flight", "BA1")
    assert resumed is not None and resumed.erased and resumed.carry is None
    assert resumed.version == 1
