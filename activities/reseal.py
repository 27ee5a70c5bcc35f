"""Reseal: the operations worker's side of a reseal batch (`workflows/reseal_batch.py`), one
page of rows at a time (`readmodel.reseal`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from durable_outbox_temporal.contract.reseal import (
    RESEAL_PAGE_ACTIVITY,
    ResealPageRequest,
    ResealPageResult,
)
from sqlalchemy import Engine, Table
from temporalio import activity
from temporalio.exceptions import ApplicationError

from readmodel.reseal import NoPayloadKeys, reseal_page


class ResealActivities:
    """Reseals pages of the read model's sealed columns under the engine's current key, over
    `tables` (`readmodel.reseal.sealed_tables`)."""

    def __init__(self, engine: Engine, tables: Sequence[Table]) -> None:
        self.engine = engine
        self.tables = list(tables)

    @activity.defn(name=RESEAL_PAGE_ACTIVITY)
    async def reseal_page(self, request: ResealPageRequest) -> ResealPageResult:
        """One page; a worker without payload keys fails it at once (no retry gives it one)."""
        try:
            return await asyncio.to_thread(
                reseal_page,
                self.engine,
                self.tables,
                request.table,
                request.cursor,
                request.limit,
            )
        except NoPayloadKeys as err:
            raise ApplicationError(str(err), type="NoPayloadKeys", non_retryable=True) from err
