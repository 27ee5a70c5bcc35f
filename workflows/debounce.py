"""A debounce window: the items of one debounce key at one destination become one delivery.

Enqueues join by update-with-start (`join`): each is confirmed once the window holds it. The
window closes on a durable timer (`durable_outbox_temporal.contract.debounce_rules.closes_at`); the
workflow then hands its carrier (the last item, with every payload in `collect` mode) to the item's
usual placement and marks the others superseded, both in one local activity that a retry repeats
harmlessly. Items arriving meanwhile open the next window in the same workflow; with none, it ends.
A cancel takes a member out (`leave`); the last one out ends the window with nothing delivered.
Why this shape: docs/decisions/debounce.md.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import TypeVar

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from durable_outbox_temporal.contract.debounce import (
        DEBOUNCE_WORKFLOW_TYPE,
        JOIN_UPDATE,
        LEAVE_UPDATE,
        WINDOW_QUERY,
        DebounceCancel,
        DebounceClose,
        DebounceInput,
        DebounceJoin,
        DebounceJoined,
        DebounceLeave,
        DebounceLeft,
        DebounceMember,
        DebounceWindowView,
        JoinOutcome,
        without_payload,
    )
    from durable_outbox_temporal.contract.debounce_rules import (
        MAX_MEMBERS,
        carried_payload,
        closes_at,
    )
    from durable_outbox_temporal.contract.item import OutboxItemInput, OutboxItemView

    from activities.debounce import DebounceActivities

# A hand-over is a start or a signal and a read-model write: far below this, retried after.
HAND_OVER_TIMEOUT = timedelta(seconds=30)
# The patch that made the window's I/O regular activities (`_run`).
_DURABLE_HAND_OVER = "debounce-durable-hand-over"
Arg = TypeVar("Arg", DebounceCancel, DebounceClose)
Result = TypeVar("Result", OutboxItemView, None)


@workflow.defn(name=DEBOUNCE_WORKFLOW_TYPE)
class DebounceWindowWorkflow:
    @workflow.init
    def __init__(self, start: DebounceInput) -> None:
        self._start = start
        self._members: list[DebounceMember] = list(start.members)
        self._closed = start.closed

    @workflow.query(name=WINDOW_QUERY)
    def window(self) -> DebounceWindowView:
        if not self._members:
            return DebounceWindowView(keys=[])
        first = self._members[0]
        spec = first.item.debounce
        return DebounceWindowView(
            keys=[member.item.key for member in self._members[:MAX_MEMBERS]],
            mode=spec.mode if spec is not None else None,
            opened_at=first.joined_at,
            closes_at=self._closes_at(),
        )

    @workflow.update(name=JOIN_UPDATE)
    def join(self, join: DebounceJoin) -> DebounceJoined:
        now = workflow.now()
        outcomes: list[JoinOutcome] = []
        for item in join.items:
            outcomes.append(self._join(item))
            if outcomes[-1] == "created":
                self._members.append(DebounceMember(item=item, joined_at=now))
        return DebounceJoined(outcomes)

    def _join(self, item: OutboxItemInput) -> JoinOutcome:
        known = next((m.item for m in self._members if m.item.key == item.key), None)
        if known is not None:
            return "member" if known.payload_hash == item.payload_hash else "conflict"
        first = self._members[0].item.debounce if self._members else None
        if first is not None and item.debounce is not None and first.mode != item.debounce.mode:
            return "mode"
        return "created"

    @workflow.update(name=LEAVE_UPDATE)
    async def leave(self, leave: DebounceLeave) -> DebounceLeft:
        member = next((m for m in self._members if m.item.key == leave.key), None)
        if member is None:
            return DebounceLeft()
        self._members.remove(member)
        view: OutboxItemView = await _run(
            DebounceActivities.cancel_member,
            DebounceCancel(item=without_payload(member.item), reason=leave.reason),
            f"cancel {member.item.key}",
        )
        return DebounceLeft(view)

    @workflow.run
    async def run(self, start: DebounceInput) -> int:
        """Close windows until none is open; the number of windows closed (all runs)."""
        while True:
            await self._wait_for_close()
            if self._members:
                await self._close()
            if workflow.info().is_continue_as_new_suggested() or not self._members:
                await workflow.wait_condition(workflow.all_handlers_finished)
                if not self._members:
                    return self._closed
                if workflow.info().is_continue_as_new_suggested():
                    workflow.continue_as_new(
                        dataclasses.replace(start, members=self._members, closed=self._closed)
                    )

    async def _wait_for_close(self) -> None:
        """Until the open window's closing time; at once when every member left. A join that
        moves the time later wakes nothing (the timer runs out and is set again for the rest),
        so a burst of joins costs one timer, not one each."""
        while self._members:
            deadline = self._closes_at()
            remaining = deadline - workflow.now()
            if remaining <= timedelta(0):
                return
            try:
                await workflow.wait_condition(
                    functools.partial(self._closes_before, deadline),
                    timeout=remaining,
                    timeout_summary="debounce window",
                )
            except TimeoutError:
                continue

    def _closes_before(self, deadline: datetime) -> bool:
        """Whether the window must close before `deadline` now (or every member left)."""
        return not self._members or self._closes_at() < deadline

    async def _close(self) -> None:
        window, self._members = self._members[:MAX_MEMBERS], self._members[MAX_MEMBERS:]
        spec = window[-1].item.debounce
        mode = spec.mode if spec is not None else "latest"
        last = window[-1].item
        carrier = dataclasses.replace(
            last,
            payload=carried_payload(mode, [member.item.payload for member in window]),
            debounce=None,
        )
        superseded = [without_payload(member.item) for member in window[:-1]]
        workflow.set_current_details(
            f"closing a window of {len(window)} item(s): {last.key} carries them"
        )
        await _run(
            DebounceActivities.close_window,
            DebounceClose(carrier=carrier, superseded=superseded),
            f"hand over {last.key}, {len(superseded)} superseded",
        )
        self._closed += 1
        workflow.set_current_details(f"{self._closed} window(s) closed")

    def _closes_at(self) -> datetime:
        joined = [(m.joined_at, m.item.debounce) for m in self._members if m.item.debounce]
        return closes_at(joined) if joined else workflow.now()


async def _run(
    activity: Callable[[DebounceActivities, Arg], Awaitable[Result]], arg: Arg, summary: str
) -> Result:
    """Run a window's I/O (a hand-over, a member's cancel) once its decision is durable.

    A regular activity is scheduled by the workflow task that decided it, so it runs only once
    that task is recorded. A local activity ran inside the task: when that task was not recorded
    (a worker lost, an update's task dropped), its write stayed while the next attempt could
    decide otherwise, the close timer and a cancel taken in the other order (a member written
    `cancelled` and carried in the window's delivery). Histories from before kept theirs.
    Why: docs/decisions/debounce.md"""
    if workflow.patched(_DURABLE_HAND_OVER):
        return await workflow.execute_activity_method(
            activity,
            arg,
            task_queue=workflow.info().task_queue,
            start_to_close_timeout=HAND_OVER_TIMEOUT,
            summary=summary,
        )
    return await workflow.execute_local_activity_method(
        activity, arg, start_to_close_timeout=HAND_OVER_TIMEOUT, summary=summary
    )
