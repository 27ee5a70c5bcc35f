"""Aggregate types plugged in by configuration (`AGGREGATE_TYPES`): the seed examples load by
default, with their projectors and migrations; an entry that does not load is refused, named."""

from __future__ import annotations

import pytest
from durable_outbox_temporal.aggregate_definition import AggregateDefinition

from configuration.settings import SEED_AGGREGATE_TYPES, Settings
from service.aggregate_types import AggregateTypeError, load_aggregate_types


def test_the_default_registers_the_seed_examples_with_their_read_models() -> None:
    types = load_aggregate_types(Settings(_env_file=None).aggregate_types)  # type: ignore[call-arg]

    assert set(types.definitions) == {"flight", "labour", "lock"}
    for name, definition in types.definitions.items():
        assert isinstance(definition, AggregateDefinition) and definition.type_name == name
        assert all(event.__name__[0].isupper() for event in definition.events)
    assert list(types.projectors) == ["labour_history"]
    assert [path.parts[-3:] for path in types.migrations] == [("examples", "labour", "migrations")]


def test_a_definition_class_is_registered_as_an_instance() -> None:
    types = load_aggregate_types(" examples.flight.domainmodel:FlightSeating , ")

    assert list(types.definitions) == ["flight"]
    assert types.projectors == {} and types.migrations == ()


@pytest.mark.parametrize(
    ("entries", "named", "why"),
    [
        ("examples.flight", "'examples.flight'", "is not `module:attribute`"),
        ("examples.nowhere:X", "'examples.nowhere:X'", "cannot import 'examples.nowhere'"),
        ("examples.flight:PLANE", "'examples.flight:PLANE'", "has nothing named 'PLANE'"),
        (
            "examples.flight.domainmodel:SeatTaken",
            "'examples.flight.domainmodel:SeatTaken'",
            "is the class SeatTaken, not an AggregateDefinition",
        ),
        (f"{SEED_AGGREGATE_TYPES},examples.flight.domainmodel:FlightSeating", "", "'flight'"),
    ],
)
def test_an_entry_that_does_not_load_is_refused_by_name(entries: str, named: str, why: str) -> None:
    with pytest.raises(AggregateTypeError) as refused:
        load_aggregate_types(entries)

    assert str(refused.value).startswith("AGGREGATE_TYPES")
    assert named in str(refused.value) and why in str(refused.value)
