"""The aggregate types a process serves, plugged in by configuration (`AGGREGATE_TYPES`).

Each entry is `module:attribute`. The attribute is an `AggregateDefinition` (an instance, or a
class made with no arguments): a type with no read models of its own, written against
`durable_outbox_temporal.aggregate_definition` alone. Or it is an `AggregateType`: a definition
with the async projectors that read its events and the Alembic migrations of their tables (a
branch of their own, applied by `create_schema` with the product's). The worker, the API and
the tests load the types with `load_aggregate_types`, the one loader, and serve what it returns.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable_outbox_temporal.aggregate_definition import AggregateDefinition, by_type_name
from sqlalchemy import Table

from readmodel.projectors.base import AsyncProjector
from readmodel.reseal import sealed_tables


@dataclass(frozen=True)
class AggregateType:
    """A type with read models of its own: its definition, its async projectors and the
    directory of its Alembic migrations (revisions on a branch of its own)."""

    definition: AggregateDefinition[Any]
    projectors: tuple[AsyncProjector, ...] = ()
    migrations: Path | None = None


@dataclass(frozen=True)
class AggregateTypes:
    """The types loaded from one `AGGREGATE_TYPES`, by type name."""

    types: Mapping[str, AggregateType] = field(default_factory=dict)

    @property
    def definitions(self) -> dict[str, AggregateDefinition[Any]]:
        return {name: served.definition for name, served in self.types.items()}

    @property
    def projectors(self) -> dict[str, AsyncProjector]:
        """Every type's async projectors, by projector name."""
        return {p.name: p for served in self.types.values() for p in served.projectors}

    @property
    def sealed_tables(self) -> list[Table]:
        """Every table with sealed columns, the product's and the projectors' (the order a
        reseal batch walks them in)."""
        return sealed_tables(p.table for p in self.projectors.values())

    @property
    def migrations(self) -> tuple[Path, ...]:
        """The migration directories of the types that have tables, for `create_schema`."""
        return tuple(t.migrations for t in self.types.values() if t.migrations is not None)


class AggregateTypeError(ValueError):
    """An `AGGREGATE_TYPES` entry that does not load; the message names it."""


def load_aggregate_types(entries: str) -> AggregateTypes:
    """The types `entries` (comma-separated `module:attribute`) name; `AggregateTypeError` for
    one that is malformed, does not import, is not a type, or repeats a type name."""
    loaded = [_load(entry.strip()) for entry in entries.split(",") if entry.strip()]
    try:
        by_type_name(served.definition for served in loaded)
    except ValueError as err:
        raise AggregateTypeError(f"AGGREGATE_TYPES: {err}") from err
    projectors = [p.name for served in loaded for p in served.projectors]
    repeated = sorted({name for name in projectors if projectors.count(name) > 1})
    if repeated:
        raise AggregateTypeError(f"AGGREGATE_TYPES: two projectors named {repeated[0]!r}")
    return AggregateTypes({served.definition.type_name: served for served in loaded})


def _load(entry: str) -> AggregateType:
    module_name, _, attribute = entry.partition(":")
    if not module_name or not attribute:
        raise AggregateTypeError(
            f"AGGREGATE_TYPES entry {entry!r} is not `module:attribute`"
            " (e.g. `examples.flight:FLIGHT`)"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise AggregateTypeError(
            f"AGGREGATE_TYPES entry {entry!r}: cannot import {module_name!r} ({err})"
        ) from err
    if not hasattr(module, attribute):
        raise AggregateTypeError(
            f"AGGREGATE_TYPES entry {entry!r}: {module_name} has nothing named {attribute!r}"
        )
    value = getattr(module, attribute)
    if isinstance(value, type) and issubclass(value, AggregateDefinition):
        value = value()
    if isinstance(value, AggregateDefinition):
        return AggregateType(value)
    if isinstance(value, AggregateType):
        return value
    what = f"the class {value.__name__}" if isinstance(value, type) else type(value).__name__
    raise AggregateTypeError(
        f"AGGREGATE_TYPES entry {entry!r} is {what}, not an AggregateDefinition or an AggregateType"
    )
