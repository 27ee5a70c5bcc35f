"""Erasure by filter: the operations worker's side of an erase batch (`workflows/erase_batch.py`),
one page of items at a time."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from durable_outbox_temporal.contract.erasure import (
    ERASE_PAGE_ACTIVITY,
    ErasePageRequest,
    ErasePageResult,
    SkippedItem,
)
from durable_outbox_temporal.contract.ids import item_workflow_id, parse_item_workflow_id
from durable_outbox_temporal.destinations import DestinationRegistry
from sqlalchemy import Engine
from temporalio import activity

from readmodel import erasure, store, subjects


class EraseActivities:
    """Erases a page of an outbox's items from the read model, each as `DELETE
    .../items/{key}/payload` would (`readmodel.erasure`), skipping those under way."""

    def __init__(self, engine: Engine, destinations: DestinationRegistry) -> None:
        self.engine = engine
        self.destinations = destinations

    @activity.defn(name=ERASE_PAGE_ACTIVITY)
    async def erase_page(self, request: ErasePageRequest) -> ErasePageResult:
        """Idempotent: an item erased already is erased again at no cost and counts once more
        only in the retried page's own result, which the batch never saw."""
        return await asyncio.to_thread(self._erase_page, request)

    def _erase_page(self, request: ErasePageRequest) -> ErasePageResult:
        # One more than a page: whether another page follows.
        wanted = request.limit + 1
        if request.subject_digest is not None:
            keys = subjects.keys_of(
                self.engine,
                request.outbox,
                request.subject_digest,
                after=request.cursor,
                limit=wanted,
            )
        else:
            keys = erasure.keys_with_prefix(
                self.engine,
                request.outbox,
                request.key_prefix or "",
                after=request.cursor,
                limit=wanted,
            )
        page, more = keys[: request.limit], len(keys) > request.limit
        erased, skipped = 0, []
        for key in page:
            reason = self._erase(item_workflow_id(request.outbox, key))
            if reason is None:
                erased += 1
            else:
                skipped.append(SkippedItem(key, reason))
        return ErasePageResult(erased, skipped, page[-1] if more else None)

    def _erase(self, item_id: str) -> str | None:
        """Erase one item; why not, when it is under way."""
        record = store.get_item(self.engine, item_id)
        if record is None:
            # Pruned by retention, what is left is its key's memory; a relay row refused for
            # good made no item; else it has not ended.
            if erasure.erase_remembered_key(self.engine, item_id) is not None:
                return None
            outbox, key = parse_item_workflow_id(item_id)
            if erasure.erase_refused_relay_rows(self.engine, outbox, key):
                return None
            return f"item {item_id!r} has no row in the read model yet: it has not ended"
        view = record.view
        destination = self.destinations.get(view.destination)
        window_s = destination.delivery.report_window_s if destination is not None else 0
        refused = erasure.refusal(view, window_s, datetime.now(UTC))
        if refused is not None:
            return refused
        try:
            at = erasure.erase_item(self.engine, item_id, [str(s) for s in erasure.ERASABLE])
        except erasure.CarrierUnderWay as err:
            return f"item {view.key!r}: {err}"
        if at is None:
            return f"item {view.key!r} is queued again (redriven): it has not ended"
        return None
