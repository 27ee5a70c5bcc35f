"""Aggregates: run commands, read state, history and the ids of a type.

A command's body is its payload as JSON (`{"seat": "1A", "passenger_id": "p1"}`); the
`Idempotency-Key` header is its command id (a repeat answers the first outcome and appends
nothing) and `?expected_version=` makes it conditional (409 when the aggregate has moved on).
A payload's `actor` (labour's commands carry one) is recorded with the events as who sent them.

The effect ledger (what the aggregate's policies asked for) is read at `.../effects`, and a
failed effect is run again with `POST .../effects/{key}/retry`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Header, Query
from pydantic import BaseModel, ValidationError

from aggregates import REGISTRY
from api.deps import AggregateServiceDep
from api.errors import validation_problem
from api.schemas import problem_responses
from contract.aggregate import (
    MAX_COMMAND_ID_LENGTH,
    AggregateView,
    CommandResult,
    EffectRecord,
    RecordedEvent,
)
from readmodel.aggregates import MAX_PAGE

router = APIRouter(
    prefix="/v1/aggregates",
    tags=["aggregates"],
    responses=problem_responses(401, 403, 404, 409, 413, 415, 422, 503),
)


class AggregateSummary(BaseModel):
    """One aggregate of a type, as the event store last wrote it."""

    id: str
    version: int
    updated_at: datetime


class AggregatePage(BaseModel):
    """A page of a type's aggregates by id; pass `next_after` back as `after`."""

    items: list[AggregateSummary]
    next_after: str | None


class AggregateType(BaseModel):
    """A registered aggregate type: its commands with their payloads' JSON schemas."""

    type: str
    commands: dict[str, dict[str, Any]]
    events: list[str]


@router.get("", response_model=list[AggregateType], summary="Registered aggregate types")
async def aggregate_types() -> list[AggregateType]:
    """Every type the registry knows, with what each command takes."""
    return [
        AggregateType(
            type=name,
            commands={
                command: model.model_json_schema() for command, model in definition.commands.items()
            },
            events=[event.__name__ for event in definition.events],
        )
        for name, definition in sorted(REGISTRY.items())
    ]


@router.post(
    "/{aggregate_type}/{aggregate_id}/commands/{name}",
    response_model=CommandResult,
    summary="Run a command (creates the aggregate on its first)",
)
async def run_command(
    aggregate_type: str,
    aggregate_id: str,
    name: str,
    aggregates: AggregateServiceDep,
    payload: Annotated[dict[str, Any], Body(description="The command's payload")],
    expected_version: Annotated[int | None, Query(ge=0)] = None,
    idempotency_key: Annotated[
        str | None, Header(max_length=MAX_COMMAND_ID_LENGTH, description="The command id")
    ] = None,
) -> CommandResult:
    """200 with the events appended and the new version; 404 unknown type or command, 409 a
    conflict with the aggregate's state (or `expected_version`), 422 an invalid payload."""
    definition = aggregates.client.check(aggregate_type, aggregate_id, name)
    try:
        definition.parse_command(name, payload)
    except ValidationError as err:
        raise validation_problem(err.errors(), ("body",)) from err
    return await aggregates.client.command(
        aggregate_type,
        aggregate_id,
        name,
        payload,
        command_id=idempotency_key,
        expected_version=expected_version,
        actor=_actor(payload),
    )


def _actor(payload: dict[str, Any]) -> str:
    """Who sent the command: the payload's own `actor` if it names one, else the API."""
    actor = payload.get("actor")
    return actor if isinstance(actor, str) and 0 < len(actor) <= 200 else "api"


@router.get(
    "/{aggregate_type}/{aggregate_id}/effects",
    response_model=list[EffectRecord],
    summary="The effect ledger",
)
async def aggregate_effects(
    aggregate_type: str,
    aggregate_id: str,
    aggregates: AggregateServiceDep,
    status: Annotated[
        Literal["pending", "done", "failed"] | None,
        Query(description="Only effects in this status"),
    ] = None,
) -> list[EffectRecord]:
    """Live from the aggregate's workflow, oldest first: each effect with its key, action,
    status, executions, error and result (done effects: the newest 200)."""
    effects = await aggregates.client.effects(aggregate_type, aggregate_id)
    return [effect for effect in effects if status is None or effect.status == status]


@router.post(
    "/{aggregate_type}/{aggregate_id}/effects/{key}/retry",
    response_model=EffectRecord,
    summary="Run a failed effect again",
)
async def retry_effect(
    aggregate_type: str, aggregate_id: str, key: str, aggregates: AggregateServiceDep
) -> EffectRecord:
    """200 with the effect, pending again; 404 for a key the ledger does not hold, 409 for an
    effect that has not failed. Its idempotency key is unchanged, so it still happens once."""
    return await aggregates.client.retry_effect(aggregate_type, aggregate_id, key)


@router.get(
    "/{aggregate_type}/{aggregate_id}", response_model=AggregateView, summary="State and version"
)
async def get_aggregate(
    aggregate_type: str, aggregate_id: str, aggregates: AggregateServiceDep
) -> AggregateView:
    """Live from the aggregate's workflow: state, version and its read models."""
    return await aggregates.state(aggregate_type, aggregate_id)


@router.get(
    "/{aggregate_type}/{aggregate_id}/events",
    response_model=list[RecordedEvent],
    summary="Events from the event store",
)
async def aggregate_events(
    aggregate_type: str,
    aggregate_id: str,
    aggregates: AggregateServiceDep,
    after: Annotated[int, Query(ge=0, description="Only events with a greater seq")] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
) -> list[RecordedEvent]:
    """Oldest first; page with `after` = the last seq seen."""
    return await aggregates.events(aggregate_type, aggregate_id, after=after, limit=limit)


@router.get("/{aggregate_type}", response_model=AggregatePage, summary="Aggregates of a type")
async def list_aggregates(
    aggregate_type: str,
    aggregates: AggregateServiceDep,
    after: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
) -> AggregatePage:
    """Ids with versions, by id."""
    records, next_after = await aggregates.list(aggregate_type, after=after, limit=limit)
    return AggregatePage(
        items=[
            AggregateSummary(id=r.id, version=r.version, updated_at=r.updated_at) for r in records
        ],
        next_after=next_after,
    )
