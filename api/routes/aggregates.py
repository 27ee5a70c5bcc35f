"""Aggregates: run commands, read state, history and the ids of a type.

A command's body is its payload as JSON (`{"seat": "1A", "passenger_id": "p1"}`); the
`Idempotency-Key` header is its command id (a repeat answers the first outcome and appends
nothing) and `?expected_version=` makes it conditional (409 when the aggregate has moved on).

Actors: where a definition names an actor field (labour's `actor`), the caller may name only an
actor its token may act as (403 otherwise), never a reserved one (`system`, the service's own);
the events record that actor, else the token's name, else `api` (no tokens configured). Reads
show a definition's secret fields only to the actors it entitles: pass `?actor=` to read as one
(a token reads as its own name by default).

The effect ledger (what the aggregate's policies asked for) is read at `.../effects`, and a
failed effect is run again with `POST .../effects/{key}/retry`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from durable_outbox_temporal.contract.aggregate import (
    MAX_COMMAND_ID_LENGTH,
    AggregateView,
    CommandResult,
    EffectRecord,
    RecordedEvent,
)
from fastapi import APIRouter, Body, Header, Query
from pydantic import BaseModel, Field, ValidationError

from api.deps import AggregateServiceDep, Caller, CallerDep
from api.errors import ApiProblem, validation_problem
from api.schemas import MAX_SQL_INTEGER, SendableJson, problem_responses
from readmodel.aggregates import MAX_PAGE

# The event store's `actor` column holds this many characters (a token's name may be longer).
_MAX_RECORDED_ACTOR = 200

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
    passivated_at: datetime | None = Field(
        default=None,
        description="When a run of it last ended idle, its carry stored for the next "
        "(docs/explanation/aggregates.md); null if none has",
    )


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
async def aggregate_types(aggregates: AggregateServiceDep) -> list[AggregateType]:
    """Every type registered (`AGGREGATE_TYPES`), with what each command takes."""
    return [
        AggregateType(
            type=name,
            commands={
                command: model.model_json_schema() for command, model in definition.commands.items()
            },
            events=[event.__name__ for event in definition.events],
        )
        for name, definition in sorted(aggregates.client.definitions.items())
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
    caller: CallerDep,
    payload: Annotated[SendableJson, Body(description="The command's payload")],
    expected_version: Annotated[int | None, Query(ge=0)] = None,
    idempotency_key: Annotated[
        str | None, Header(max_length=MAX_COMMAND_ID_LENGTH, description="The command id")
    ] = None,
) -> CommandResult:
    """200 with the events appended and the new version; 403 an actor the caller may not act
    as, 404 unknown type or command, 409 a conflict with the aggregate's state (or
    `expected_version`), 422 an invalid payload."""
    definition = aggregates.client.check(aggregate_type, aggregate_id, name)
    try:
        definition.parse_command(name, payload)
    except ValidationError as err:
        raise validation_problem(err.errors(), ("body",)) from err
    actor = definition.command_actor(payload)
    if actor is not None:
        _authorise(caller, actor)
    return await aggregates.client.command(
        aggregate_type,
        aggregate_id,
        name,
        payload,
        command_id=idempotency_key,
        expected_version=expected_version,
        actor=(actor or caller.principal or "api")[:_MAX_RECORDED_ACTOR],
    )


def _authorise(caller: Caller, actor: str) -> None:
    """403 problem+json unless the caller may act as `actor`."""
    if not caller.may_act_as(actor):
        who = f"token '{caller.principal}'" if caller.principal else "this caller"
        raise ApiProblem(
            403,
            "actor-not-allowed",
            "Actor not allowed",
            f"{who} may not act as '{actor}'",
            actor=actor,
        )


def _reader(caller: Caller, actor: str | None) -> str | None:
    """Whom a read is for: `?actor=` once the caller may act as it, else the token's own name."""
    if actor is not None:
        _authorise(caller, actor)
        return actor
    principal = caller.principal
    return principal if principal is not None and caller.may_act_as(principal) else None


ReadAs = Annotated[
    str | None,
    Query(
        max_length=200,
        description="Read as this actor (one the token may act as): secret fields show to "
        "the actors the aggregate's definition entitles",
    ),
]


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
    """Live from the aggregate's workflow (or as its run stored it as it ended idle), oldest
    first: each effect with its key, action, status, executions, error and result (done
    effects: the newest 200)."""
    effects = await aggregates.effects(aggregate_type, aggregate_id)
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
    aggregate_type: str,
    aggregate_id: str,
    aggregates: AggregateServiceDep,
    caller: CallerDep,
    actor: ReadAs = None,
) -> AggregateView:
    """Live from the aggregate's workflow: state, version and its read models; secret fields
    redacted unless the reader may see them (403 for an `actor` the caller may not act as)."""
    reader = _reader(caller, actor)
    return await aggregates.state(aggregate_type, aggregate_id, reader=reader)


@router.get(
    "/{aggregate_type}/{aggregate_id}/events",
    response_model=list[RecordedEvent],
    summary="Events from the event store",
)
async def aggregate_events(
    aggregate_type: str,
    aggregate_id: str,
    aggregates: AggregateServiceDep,
    caller: CallerDep,
    after: Annotated[
        int, Query(ge=0, le=MAX_SQL_INTEGER, description="Only events with a greater seq")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    actor: ReadAs = None,
) -> list[RecordedEvent]:
    """Oldest first; page with `after` = the last seq seen. Secret fields as in the state."""
    reader = _reader(caller, actor)
    return await aggregates.events(
        aggregate_type, aggregate_id, after=after, limit=limit, reader=reader
    )


class AggregateErased(BaseModel):
    """When the aggregate's data was erased from the event store."""

    erased_at: datetime


@router.delete(
    "/{aggregate_type}/{aggregate_id}/data",
    response_model=AggregateErased,
    summary="Erase an aggregate's data from the event store (crypto-shredding)",
)
async def erase_aggregate_data(
    aggregate_type: str, aggregate_id: str, aggregates: AggregateServiceDep
) -> AggregateErased:
    """Deletes the aggregate's data key: every event written so far keeps its seq, type, time
    and actor, and its data reads as `{"$shredded": true}`, as does the stored state; the store
    still replays (projectors pass such events over). Idempotent: a repeat answers the first
    time. The live aggregate keeps its current state (its workflow's, encrypted in Temporal):
    run the definition's own command that forgets the subject first, then erase
    (docs/decisions/aggregate-crypto-shredding.md)."""
    return AggregateErased(erased_at=await aggregates.erase(aggregate_type, aggregate_id))


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
            AggregateSummary(
                id=r.id, version=r.version, updated_at=r.updated_at, passivated_at=r.passivated_at
            )
            for r in records
        ],
        next_after=next_after,
    )
