"""A redrive batch's page of dead letters (`workflows/redrive_batch.py`), on the operations
worker. Each item is redriven by the item use case the API's redrive is (`ItemService.redrive`),
which the worker injects: the service and the activities import nothing of each other."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable

from durable_outbox_temporal import EnqueueResult, OutboxError, TemporalUnavailable
from durable_outbox_temporal.contract.dead_letters import (
    REDRIVE_PAGE_ACTIVITY,
    RedrivePageRequest,
    RedrivePageResult,
)
from durable_outbox_temporal.fan_out import fan_out
from sqlalchemy import Engine
from temporalio import activity

from readmodel.dead_letters import list_dead_letters

# Runs one item again by outbox and key, the read model's checks and claim included.
RedriveItem = Callable[[str, str], Awaitable[EnqueueResult]]


class RedriveActivities:
    """The operations worker's side of a redrive batch: one page of dead letters at a time."""

    def __init__(self, redrive: RedriveItem, engine: Engine) -> None:
        self.redrive = redrive
        self.engine = engine

    @activity.defn(name=REDRIVE_PAGE_ACTIVITY)
    async def redrive_page(self, request: RedrivePageRequest) -> RedrivePageResult:
        """Redrive one page of the selected dead letters. A retried page finds the ones it
        redrove no longer failed and skips them, so nothing is started twice."""
        letters, next_cursor = await asyncio.to_thread(
            list_dead_letters,
            self.engine,
            request.outbox,
            request.filter,
            failed_before=request.failed_before,
            cursor=request.cursor,
            limit=request.limit,
        )
        keys = [letter.record.view.key for letter in letters]
        outcomes = await fan_out(
            [functools.partial(self.redrive, request.outbox, key) for key in keys]
        )
        redriven: list[str] = []
        errors: list[str] = []
        for key, outcome in zip(keys, outcomes, strict=True):
            if not isinstance(outcome, Exception):
                redriven.append(key)
            elif isinstance(outcome, OutboxError) and not isinstance(outcome, TemporalUnavailable):
                errors.append(f"{key}: {outcome}")  # redriven meanwhile, say: reported, skipped
            else:
                raise outcome  # the page is retried; what it redrove is then skipped
        return RedrivePageResult(
            redriven=redriven,
            skipped=len(keys) - len(redriven),
            next_cursor=next_cursor,
            errors=errors,
        )
