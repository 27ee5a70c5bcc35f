"""Run an aggregate type's commands as plain functions, as the workflow does, for its tests."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from durable_outbox_temporal.aggregate_definition import AggregateDefinition, Event

NOW = datetime(2026, 11, 23, 12, tzinfo=UTC)


def run(definition: AggregateDefinition[Any], commands: list[tuple[str, dict[str, Any]]]) -> Any:
    """Fold the commands through decide and evolve from the initial state."""
    state = definition.initial_state()
    for name, payload in commands:
        for event in definition.decide(state, definition.parse_command(name, payload), NOW):
            state = definition.evolve(state, event)
    return state


def decide(
    definition: AggregateDefinition[Any], state: Any, name: str, payload: dict[str, Any]
) -> list[Event]:
    """The events one command decides from `state`."""
    return definition.decide(state, definition.parse_command(name, payload), NOW)
