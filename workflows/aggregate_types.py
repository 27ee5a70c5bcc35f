"""The aggregate types this process's workflows host: the aggregate workflow finds its
definition here by type name.

The workflow imports this module passed through the sandbox, so every run, sandboxed or not,
sees the one registry the worker filled at start-up (`host`, from `AGGREGATE_TYPES`): a
definition is code, which no workflow input can carry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from durable_outbox_temporal.aggregate_definition import AggregateDefinition, by_type_name

HOSTED: dict[str, AggregateDefinition[Any]] = {}


def host(
    definitions: Iterable[AggregateDefinition[Any]] | Mapping[str, AggregateDefinition[Any]],
) -> None:
    """Host these types from now on (a type name hosted before takes the new definition)."""
    HOSTED.update(by_type_name(definitions))
