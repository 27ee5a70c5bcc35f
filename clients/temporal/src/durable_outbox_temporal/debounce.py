"""Where a debounced item waits: its key's window workflow (`workflows/debounce.py`).

Joins go by update-with-start, so each enqueue is confirmed once its window holds it. Per
window, one `join` update is in flight from a process at a time, carrying every join that
arrived meanwhile (`durable_outbox_temporal.mailbox`): Temporal takes at most 10 updates in flight
per workflow, and a window refused for that by the server (several processes at once) is asked
again after a pause.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta

from temporalio.client import Client, WithStartWorkflowOperation, WorkflowUpdateFailedError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.service import RPCError, RPCStatusCode

from durable_outbox_temporal.contract.debounce import (
    DEBOUNCE_WORKFLOW_TYPE,
    JOIN_UPDATE,
    LEAVE_UPDATE,
    WINDOW_QUERY,
    DebounceInput,
    DebounceJoin,
    DebounceJoined,
    DebounceLeave,
    DebounceLeft,
    DebounceWindowView,
    debounce_workflow_id,
)
from durable_outbox_temporal.contract.item import OutboxItemInput, OutboxItemView
from durable_outbox_temporal.contract.lane import MAX_APPEND_BATCH, entry_size
from durable_outbox_temporal.errors import IdempotencyConflict, InvalidRequest
from durable_outbox_temporal.mailbox import Mailbox
from durable_outbox_temporal.placement import RPC_TIMEOUT, outcomes_of
from durable_outbox_temporal.updates import update_with_start

# A join batch's payload bytes at most (an item larger than this goes alone).
MAX_JOIN_BYTES = 512 * 1024
# How often a join refused for too many updates in flight goes again, and the first pause.
BUSY_RETRIES = 8
BUSY_PAUSE_S = 0.05
# How long a join waits for a worker to take it before it fails (the window holds nothing then).
JOIN_WAIT = timedelta(seconds=30)

Outcome = bool | Exception


class Debouncer:
    """Joins debounced items to their windows, takes members out, and reads a window."""

    def __init__(self, temporal: Callable[[], Awaitable[Client]], task_queue: str) -> None:
        self._temporal = temporal
        self.task_queue = task_queue
        self._mailbox: Mailbox[OutboxItemInput, Outcome] = Mailbox(
            self._send,
            max_batch=MAX_APPEND_BATCH,
            size=lambda item: entry_size(item.key, item.payload),
            max_size=MAX_JOIN_BYTES,
        )

    async def hand_over(self, items: Sequence[OutboxItemInput]) -> list[bool | Exception]:
        """Each item joined to its window (True), found there already (False), or an error."""
        return outcomes_of(
            await asyncio.gather(
                *(self._mailbox.call(_window_id(item), item) for item in items),
                return_exceptions=True,
            )
        )

    async def _send(self, window_id: str, items: list[OutboxItemInput]) -> list[Outcome]:
        first = items[0]
        assert first.debounce is not None
        client = await self._temporal()
        start = DebounceInput(first.outbox, first.destination, first.debounce.key)
        joined: DebounceJoined | None = None
        for attempt in range(BUSY_RETRIES + 1):
            try:
                joined = await update_with_start(
                    client,
                    JOIN_UPDATE,
                    DebounceJoin(items),
                    start=lambda: WithStartWorkflowOperation(
                        DEBOUNCE_WORKFLOW_TYPE,
                        start,
                        id=window_id,
                        task_queue=self.task_queue,
                        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                        # A window that ended opens again for the next item.
                        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                        static_summary=f"Outbox {first.outbox}: debounce window"
                        f" {first.debounce.key if first.debounce else ''} to {first.destination}",
                    ),
                    result_type=DebounceJoined,
                    rpc_timeout=JOIN_WAIT,
                )
                break
            except RPCError as err:
                if err.status != RPCStatusCode.RESOURCE_EXHAUSTED or attempt == BUSY_RETRIES:
                    raise
                await asyncio.sleep(BUSY_PAUSE_S * 2**attempt)
        assert joined is not None
        return [
            _outcome(item, outcome) for item, outcome in zip(items, joined.outcomes, strict=True)
        ]

    async def leave(self, view: OutboxItemView, reason: str) -> OutboxItemView | None:
        """Cancel a member still in its window: its view; None once its window closed (or
        ended), when the item is wherever its window handed it."""
        if view.debounce_key is None:
            return None
        client = await self._temporal()
        handle = client.get_workflow_handle(
            debounce_workflow_id(view.outbox, view.destination, view.debounce_key)
        )
        try:
            left: DebounceLeft = await handle.execute_update(
                LEAVE_UPDATE,
                DebounceLeave(view.key, reason),
                result_type=DebounceLeft,
                rpc_timeout=RPC_TIMEOUT,
            )
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return None
            raise
        except WorkflowUpdateFailedError:
            return None  # the window ended while the update waited: its items left it
        return left.view

    async def window(self, view: OutboxItemView) -> DebounceWindowView | None:
        """The open window of `view`'s debounce key; None if there is none."""
        if view.debounce_key is None:
            return None
        client = await self._temporal()
        handle = client.get_workflow_handle(
            debounce_workflow_id(view.outbox, view.destination, view.debounce_key)
        )
        try:
            window: DebounceWindowView = await handle.query(
                WINDOW_QUERY, result_type=DebounceWindowView, rpc_timeout=RPC_TIMEOUT
            )
        except RPCError as err:
            if err.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION):
                return None
            raise
        return window


def _window_id(item: OutboxItemInput) -> str:
    assert item.debounce is not None
    return debounce_workflow_id(item.outbox, item.destination, item.debounce.key)


def _outcome(item: OutboxItemInput, outcome: str) -> Outcome:
    if outcome == "created":
        return True
    if outcome == "member":
        return False
    if outcome == "conflict":
        return IdempotencyConflict(
            f"key {item.key!r} waits in its debounce window with a different request"
        )
    return InvalidRequest(
        "the open debounce window of this key has another debounce_mode: wait for it to close"
    )
