"""Purge: the operations worker's side of a purge batch (`workflows/purge_batch.py`), one page
of items not yet submitted at a time."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence

from durable_outbox_temporal import (
    CannotCancel,
    ItemNotFound,
    OutboxClient,
    OutboxError,
    TemporalUnavailable,
)
from durable_outbox_temporal.client import CANCEL_WAIT
from durable_outbox_temporal.contract.item import ItemStatus, OutboxItemView
from durable_outbox_temporal.contract.purge import (
    PURGE_PAGE_ACTIVITY,
    PurgePageRequest,
    PurgePageResult,
)
from durable_outbox_temporal.fan_out import fan_out
from durable_outbox_temporal.validation import validate_purge
from sqlalchemy import Engine
from temporalio import activity
from temporalio.exceptions import ApplicationError

from readmodel import store


class PurgeActivities:
    """The operations worker's side of a purge batch: one page of items at a time, over the
    client and the read model (which lists the bulk-mode items)."""

    def __init__(self, client: OutboxClient, engine: Engine) -> None:
        self.client = client
        self.engine = engine

    @activity.defn(name=PURGE_PAGE_ACTIVITY)
    async def purge_page(self, request: PurgePageRequest) -> PurgePageResult:
        """Cancel one page; a refusal no retry can change (an unknown destination, say) fails
        the page at once, with its reason."""
        try:
            return await self._cancel_page(request)
        except OutboxError as err:
            if isinstance(err, TemporalUnavailable):
                raise
            raise ApplicationError(str(err), type=type(err).__name__, non_retryable=True) from err

    async def _cancel_page(self, request: PurgePageRequest) -> PurgePageResult:
        """Cancel one page of the items not yet submitted, in key order after the cursor; the
        first page takes the items waiting in lanes out too.

        An item the provider accepted (or that ended) meanwhile is left alone (skipped); one
        whose worker does not answer is cancelled by signal when a worker returns.
        """
        outbox, destination, reason = request.outbox, request.destination, request.reason
        validate_purge(outbox, destination, self.client.destinations)
        in_lanes: list[str] = []
        if request.cursor is None:
            # Waiting items first: a lane would otherwise start its next one while its head is
            # being cancelled.
            in_lanes = await self.client.purge_lanes(outbox, destination, reason)
        own = await self.client.queued_keys(outbox, destination)
        # Bulk-mode items have no workflow in visibility: the read model lists them.
        bulk = {view.key: view for view in await self._queued_bulk_items(outbox, destination)}
        after = request.cursor
        candidates = sorted({key for key in [*own, *bulk] if after is None or key > after})
        keys, rest = candidates[: request.limit], candidates[request.limit :]
        outcomes = await fan_out(
            [
                functools.partial(
                    self.client.cancel,
                    outbox,
                    key,
                    reason,
                    wait=CANCEL_WAIT,
                    known=bulk.get(key),
                )
                for key in keys
            ]
        )
        cancelled = list(in_lanes)
        for key, outcome in zip(keys, outcomes, strict=True):
            if isinstance(outcome, (CannotCancel, ItemNotFound)):
                continue  # handed to the provider, or ended, since the listing
            if isinstance(outcome, Exception):
                raise outcome  # the page is retried; what it cancelled is then skipped
            cancelled.append(key)
        return PurgePageResult(
            cancelled=cancelled,
            skipped=len(keys) + len(in_lanes) - len(cancelled),
            next_cursor=keys[-1] if rest else None,
        )

    async def _queued_bulk_items(
        self, outbox: str, destination: str | None
    ) -> Sequence[OutboxItemView]:
        names = [
            d.name
            for d in self.client.destinations.bulk_destinations()
            if destination in (None, d.name)
        ]
        found: list[OutboxItemView] = []
        for name in names:
            cursor = None
            while True:
                records, cursor = await asyncio.to_thread(
                    store.list_items,
                    self.engine,
                    outbox,
                    status=ItemStatus.QUEUED.value,
                    destination=name,
                    cursor=cursor,
                    limit=500,
                )
                found += [record.view for record in records]
                if cursor is None:
                    break
        return found
