"""A replay batch's page (`workflows/replay_batch.py`), on the operations worker: the next page
of the items its filter selects, each enqueued again as a new item to the target destination.

The enqueue is the API's (`ItemService.enqueue_many`, which the worker injects): the new items
are ordinary items of the target, paced by its rules and signed for it when submitted, and a
key taken already (a retried page, or the same replay run again) adds nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Protocol

from durable_outbox_temporal import EnqueueResult, OutboxError, TemporalUnavailable
from durable_outbox_temporal.contract.item import NewItem
from durable_outbox_temporal.contract.replay import (
    REPLAY_PAGE_ACTIVITY,
    ReplayPageRequest,
    ReplayPageResult,
    replay_key,
)
from sqlalchemy import Engine
from temporalio import activity

from readmodel import store
from readmodel.replays import ReplayLink, erased_among, record_replays


class Handed(Protocol):
    """What an enqueue answers for one item: its id, and whether this call created it."""

    @property
    def result(self) -> EnqueueResult: ...


# Enqueues items of one outbox; one failure fails only its item (an exception in its place).
EnqueueItems = Callable[[str, Sequence[NewItem]], Awaitable[Sequence[Handed | Exception]]]


class ReplayActivities:
    """The operations worker's side of a replay batch: one page of the read model at a time."""

    def __init__(self, enqueue: EnqueueItems, engine: Engine) -> None:
        self.enqueue = enqueue
        self.engine = engine

    @activity.defn(name=REPLAY_PAGE_ACTIVITY)
    async def replay_page(self, request: ReplayPageRequest) -> ReplayPageResult:
        """Replay one page; a retried page finds its keys taken and counts them `already`."""
        which = request.filter
        created_to = request.created_before
        if which.created_to is not None:
            created_to = min(created_to, which.created_to)
        records, next_cursor = await asyncio.to_thread(
            store.list_items,
            self.engine,
            request.outbox,
            statuses=which.statuses,
            destination=which.destination,
            key_prefix=which.key_prefix,
            created_from=which.created_from,
            created_to=created_to,
            cursor=request.cursor,
            limit=request.limit,
        )
        erased = await asyncio.to_thread(
            erased_among, self.engine, [record.view.id for record in records]
        )
        # An erased item's row keeps no payload; a pruned one (its claim-check blob gone, or a
        # row projected without it) has none either: both are skipped, counted apart.
        sendable = [r for r in records if r.view.id not in erased and r.payload is not None]
        items = [
            NewItem(
                destination=request.target,
                payload=record.payload or {},
                key=replay_key(request.replay_id, record.view.key),
            )
            for record in sendable
        ]
        outcomes = await self.enqueue(request.outbox, items)
        replayed = already = 0
        errors: list[str] = []
        links: list[ReplayLink] = []
        now = datetime.now(UTC)
        for record, item, outcome in zip(sendable, items, outcomes, strict=True):
            if isinstance(outcome, Exception):
                if isinstance(outcome, OutboxError) and not isinstance(
                    outcome, TemporalUnavailable
                ):
                    errors.append(f"{record.view.key}: {outcome}")  # refused: reported, skipped
                    continue
                raise outcome  # the page is retried; what it enqueued is then `already`
            replayed += outcome.result.created
            already += not outcome.result.created
            links.append(
                ReplayLink(
                    replay_item_id=outcome.result.item_id,
                    original_item_id=record.view.id,
                    outbox=request.outbox,
                    replay_id=request.replay_id,
                    original_key=record.view.key,
                    replay_key=item.key,
                    destination=request.target,
                    replayed_at=now,
                )
            )
        await asyncio.to_thread(record_replays, self.engine, links)
        return ReplayPageResult(
            replayed=replayed,
            already=already,
            erased=len(erased),
            pruned=len(records) - len(erased) - len(sendable),
            next_cursor=next_cursor,
            errors=errors,
        )
