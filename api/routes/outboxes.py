"""Outboxes: what exists, and per-outbox counts and rates in force."""

from __future__ import annotations

import asyncio

from durable_outbox_temporal import is_temporal_unavailable, validate_outbox
from fastapi import APIRouter
from temporalio.service import RPCError

from api.deps import DestinationControlsDep, DestinationsDep, EngineDep
from api.schemas import (
    DestinationInfo,
    OutboxStats,
    OutboxSummary,
    RelayBacklog,
    problem_responses,
)
from readmodel import store
from service.relay import relay_stats

router = APIRouter(
    prefix="/v1/outboxes", tags=["outboxes"], responses=problem_responses(401, 403, 422, 503)
)


@router.get("", response_model=list[OutboxSummary], summary="Outboxes with counts by status")
async def list_outboxes(engine: EngineDep) -> list[OutboxSummary]:
    """Every outbox the read model has seen, by name."""
    outboxes = await asyncio.to_thread(store.list_outboxes, engine)
    return [
        OutboxSummary(outbox=name, counts=counts, total=sum(counts.values()))
        for name, counts in sorted(outboxes.items())
    ]


@router.get("/{outbox}/stats", response_model=OutboxStats, summary="Counts and rates in force")
async def outbox_stats(
    outbox: str, engine: EngineDep, destinations: DestinationsDep, controls: DestinationControlsDep
) -> OutboxStats:
    """Counts by status, and every destination with its configured rates and, from the server,
    the rates in force and whether it is paused."""
    validate_outbox(outbox)
    counts = await asyncio.to_thread(store.counts_by_status, engine, outbox)
    try:
        in_force = {state.destination.name: state for state in await controls.states()}
    except Exception as err:
        # Temporal down, or a server without task-queue config: the counts still answer.
        if not (isinstance(err, RPCError) or is_temporal_unavailable(err)):
            raise
        in_force = {}
    infos = []
    for d in destinations:
        state = in_force.get(d.name)
        infos.append(
            DestinationInfo(
                name=d.name,
                provider=d.provider,
                submit_rate=d.submit_rate,
                poll_rate=d.poll_rate,
                max_attempts=d.max_attempts,
                paused=state.paused if state else None,
                submit_rate_in_force=state.submit.rate if state else None,
                poll_rate_in_force=state.poll.rate if state else None,
            )
        )
    relay = await asyncio.to_thread(relay_stats, engine, outbox)
    return OutboxStats(
        outbox=outbox,
        counts=counts,
        total=sum(counts.values()),
        destinations=infos,
        relay=RelayBacklog(
            pending=relay.pending, refused=relay.refused, lag_s=relay.oldest_pending_age_s
        ),
    )
