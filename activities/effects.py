"""The effect executor's activity: what an aggregate's policies ask for, done once per key.

Runs on the operations worker. The effect's idempotency key does the once: it is the outbox
item's key (a repeated enqueue returns the same item) and the issued command's id (a repeated
command is answered as a duplicate and appends nothing). So an execution retried after a crash,
a timeout or a replay has no second effect. Provider calls do not come here: the aggregate
workflow runs them on the destination's own submit queue, under its rate.
"""

from __future__ import annotations

import secrets
from typing import Any

from durable_outbox_temporal import OutboxClient
from durable_outbox_temporal import errors as client_errors
from durable_outbox_temporal.aggregate_definition import EnqueueItem, IssueCommand, parse_action
from durable_outbox_temporal.aggregates import AggregateClient
from durable_outbox_temporal.contract.aggregate import (
    EFFECT_ACTIVITY,
    EffectErrorType,
    EffectExecution,
)
from temporalio import activity
from temporalio.exceptions import ApplicationError

# Who the events of a policy's command are recorded as coming from.
POLICY_ACTOR = "policy"
# Outcomes no retry can change: the effect fails at once, with the reason, for an operator.
_REFUSALS = (
    client_errors.CommandConflict,
    client_errors.IdempotencyConflict,
    client_errors.InvalidCommand,
    client_errors.InvalidRequest,
    client_errors.UnknownAggregate,
    client_errors.UnknownCommand,
    client_errors.UnknownDestination,
)


class EffectActivities:
    """Executes enqueue and command effects through the outbox and aggregate clients."""

    def __init__(self, outbox: OutboxClient, aggregates: AggregateClient) -> None:
        self._outbox = outbox
        self._aggregates = aggregates

    @activity.defn(name=EFFECT_ACTIVITY)
    async def execute_effect(self, effect: EffectExecution) -> dict[str, Any]:
        """Do the effect; its result for the ledger. Refusals are non-retryable errors."""
        action = parse_action(effect.kind, effect.action)
        try:
            if isinstance(action, EnqueueItem):
                return await self._enqueue(effect.key, action)
            if isinstance(action, IssueCommand):
                return await self._issue(effect, action)
        except _REFUSALS as err:
            raise ApplicationError(
                f"{type(err).__name__}: {err}", type=EffectErrorType.REFUSED, non_retryable=True
            ) from err
        raise ApplicationError(
            f"the operations worker does not execute {effect.kind} effects",
            type=EffectErrorType.REFUSED,
            non_retryable=True,
        )

    async def _enqueue(self, key: str, action: EnqueueItem) -> dict[str, Any]:
        result = await self._outbox.enqueue(
            action.outbox,
            action.destination,
            dict(action.payload),
            key=key,
            ordering_key=action.ordering_key,
        )
        return {"item_id": result.item_id, "created": result.created}

    async def _issue(self, effect: EffectExecution, action: IssueCommand) -> dict[str, Any]:
        target_type = action.target_type or effect.aggregate_type
        target_id = action.target_id or effect.aggregate_id
        payload = dict(action.payload)
        for name in action.generated_tokens:
            payload[name] = secrets.token_urlsafe(24)
        result = await self._aggregates.command(
            target_type,
            target_id,
            action.command,
            payload,
            command_id=effect.key,
            actor=POLICY_ACTOR,
            generated_fields=action.generated_tokens,
        )
        return {
            "target": f"{target_type}/{target_id}",
            "version": result.version,
            "duplicate": result.duplicate,
        }
