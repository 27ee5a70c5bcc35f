"""Where a submit or poll activity's transition is projected: in the activity, in the step that
already did I/O, by a process that has the read model (`ProjectedHere`), or by the workflow's
local activity (`LeftToWorkflow`). Why: docs/decisions/projection-in-activities.md

Either way the activity's result says so: `projected_at` is set only for a transition written
here, and the workflow writes any other itself.
"""

from __future__ import annotations

import functools
import time
from datetime import datetime, timedelta
from typing import Any, Protocol

from durable_outbox_temporal.contract import transitions
from durable_outbox_temporal.contract.item import (
    PollResult,
    ProjectionContext,
    SubmitResult,
)
from temporalio import activity

from readmodel.store import last_event_seq
from readmodel.writer import ProjectionWriter


class TransitionProjection(Protocol):
    """Projects the transition a request's result causes, given the item's `context`."""

    async def submitted(
        self,
        item_id: str,
        context: ProjectionContext,
        payload: dict[str, Any],
        result: SubmitResult,
        began: float,
    ) -> None: ...

    async def polled(
        self, item_id: str, context: ProjectionContext, result: PollResult, began: float
    ) -> None: ...


class LeftToWorkflow:
    """A process without the read model: the workflow projects every transition itself."""

    async def submitted(
        self,
        item_id: str,
        context: ProjectionContext,
        payload: dict[str, Any],
        result: SubmitResult,
        began: float,
    ) -> None:
        """Nothing written here: the result's `projected_at` stays unset."""

    async def polled(
        self, item_id: str, context: ProjectionContext, result: PollResult, began: float
    ) -> None:
        """Nothing written here: the result's `projected_at` stays unset."""


class ProjectedHere:
    """Writes each transition with the process's one group-commit `writer`, at the server's time
    of the attempt (`began`: when the activity started here), and marks the result."""

    def __init__(self, writer: ProjectionWriter) -> None:
        self._writer = writer

    async def submitted(
        self,
        item_id: str,
        context: ProjectionContext,
        payload: dict[str, Any],
        result: SubmitResult,
        began: float,
    ) -> None:
        at = _server_now(began)
        renumbered = await self._follow_earlier_attempt(item_id, context)
        transitions.apply_submit_result(context.item, context.state, result, at)
        if renumbered:
            result.projected_seq = context.state.last_event_seq
        if await self._project(item_id, context, payload):
            result.projected_at = at

    async def polled(
        self, item_id: str, context: ProjectionContext, result: PollResult, began: float
    ) -> None:
        at = _server_now(began)
        renumbered = await self._follow_earlier_attempt(item_id, context)
        applied = transitions.apply_poll_result(context.item, context.state, result, at)
        if applied and renumbered:
            result.projected_seq = context.state.last_event_seq
        if applied and await self._project(item_id, context, None):
            result.projected_at = at

    async def _follow_earlier_attempt(self, item_id: str, context: ProjectionContext) -> bool:
        """On a retry (or an attempt whose item says an earlier activity's rows may lead,
        `OutboxItemState.rows_may_lead`), number this attempt's events after any an earlier
        attempt wrote; whether that moved them.

        An attempt killed after it wrote its outcome's events and before it reported them leaves
        those rows behind, and the retry's provider answer may differ (a poll that saw Running,
        then Succeeded). Rows are idempotent by (item, seq), so a retry that reused the numbers
        would be dropped and the read model would never see the item end."""
        if activity.info().attempt == 1 and not context.state.rows_may_lead:
            return False
        written = await self._writer.run(functools.partial(last_event_seq, item_id=item_id))
        if written is None or written <= context.state.last_event_seq:
            return False
        context.state.last_event_seq = written
        return True

    async def _project(
        self, item_id: str, context: ProjectionContext, payload: dict[str, Any] | None
    ) -> bool:
        """Write the context's pending events; whether they were written. A failed write is
        the workflow's to retry (its local activity), never a reason to submit again."""
        if payload is None and transitions.starts_item(context.state.events):
            return False  # the generation's first row needs the payload this request lacks
        projection = transitions.projection(item_id, context.item, context.state, payload)
        try:
            await self._writer.write(projection)
        except Exception as err:
            activity.logger.warning("projection of %s left to the workflow: %s", item_id, err)
            return False
        return True


def _server_now(began: float) -> datetime:
    """Now on the Temporal server's clock, which the workflow's `workflow.now()` reads too: when
    the server started this attempt, plus how long it has run here. (The worker's own clock may
    differ from the server's; the time-skipping test server's differs by design.)"""
    return activity.info().started_time + timedelta(seconds=time.monotonic() - began)
