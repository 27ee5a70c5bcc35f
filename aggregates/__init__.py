"""Event-sourced aggregates: plain-Python definitions and the registry of known types.

A new aggregate type is one module (a `AggregateDefinition` subclass) plus one line in
`REGISTRY`; the generic workflow, the API and the event store serve it from there.
"""

from aggregates.definition import AggregateDefinition
from aggregates.flight import FlightSeating
from aggregates.labour import LabourTracking
from aggregates.lock import Lock

REGISTRY: dict[str, AggregateDefinition] = {  # type: ignore[type-arg]
    definition.type_name: definition for definition in (FlightSeating(), LabourTracking(), Lock())
}
