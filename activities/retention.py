"""Retention: the operations worker's side of a `Retention` run (`workflows/retention.py`): the
rules from the worker's destinations, and one page of pruning at a time (`readmodel.retention`)."""

from __future__ import annotations

import asyncio

from durable_outbox_temporal.contract.retention import (
    PRUNE_PAGE_ACTIVITY,
    RETENTION_PLAN_ACTIVITY,
    PrunePageRequest,
    PrunePageResult,
    RetentionPlan,
    RetentionPlanRequest,
    RetentionRule,
)
from durable_outbox_temporal.destinations import DestinationRegistry
from sqlalchemy import Engine
from temporalio import activity

from readmodel.retention import prune_payloads, prune_rows


class RetentionActivities:
    """Plans and prunes over the read model, by the retention `registry` configures."""

    def __init__(self, engine: Engine, registry: DestinationRegistry) -> None:
        self.engine = engine
        self.registry = registry

    @activity.defn(name=RETENTION_PLAN_ACTIVITY)
    async def retention_plan(self, _: RetentionPlanRequest) -> RetentionPlan:
        """One rule per destination for the outboxes without overrides, then one per outbox
        with an override and destination."""
        overridden = self.registry.overridden_outboxes()
        rules = []
        for outbox in [None, *overridden]:
            for destination in self.registry:
                payload_s, item_s = self.registry.retention(outbox, destination)
                rules.append(
                    RetentionRule(
                        destination=destination.name,
                        outbox=outbox,
                        payload_retention_s=payload_s,
                        item_retention_s=item_s,
                        excluded=overridden if outbox is None else [],
                    )
                )
        return RetentionPlan(rules)

    @activity.defn(name=PRUNE_PAGE_ACTIVITY)
    async def prune_page(self, request: PrunePageRequest) -> PrunePageResult:
        """One page of the rule's phase: payloads, or rows."""
        prune = prune_payloads if request.phase == "payloads" else prune_rows
        pruned = await asyncio.to_thread(
            prune, self.engine, request.rule, request.ended_before, request.limit
        )
        return PrunePageResult(pruned=pruned, more=pruned == request.limit)
