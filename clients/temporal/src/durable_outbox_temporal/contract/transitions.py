"""An item's transitions as pure functions: the one place a transition's state and event are
computed, whoever computes them.

The delivery state machine applies them inside the workflow; the submit and poll activities apply
the same ones to a copy of the state to write the projection where their I/O already happens (no
local activity per transition). Both pass the same `at` (the activity's clock, returned in its
result), so the read model and the workflow hold the same view and the same events.
"""

import dataclasses
from datetime import datetime, timedelta
from typing import Any

from durable_outbox_temporal.contract.item import (
    ItemEvent,
    ItemEventType,
    ItemProjection,
    ItemStatus,
    OperationStatus,
    OutboxItemInput,
    OutboxItemState,
    OutboxItemView,
    PollResult,
    ProjectionContext,
    Recipient,
    SubmitResult,
)


def record(
    state: OutboxItemState,
    event: ItemEventType,
    status: ItemStatus,
    at: datetime,
    detail: str | None,
) -> bool:
    """Move the state to `status` and append its event; whether the status changed."""
    changed = status is not state.status
    state.status = status
    state.updated_at = at
    state.last_event_seq += 1
    state.events.append(
        ItemEvent(
            seq=state.last_event_seq,
            type=event,
            status=status,
            at=at,
            attempt=state.attempts,
            detail=detail,
            error_code=state.last_error_code if status is ItemStatus.FAILED else None,
        )
    )
    return changed


def finish(
    state: OutboxItemState,
    status: ItemStatus,
    event: ItemEventType,
    at: datetime,
    detail: str | None,
) -> bool:
    """End the item; whether the status changed (it always does, from a running status)."""
    if status is ItemStatus.FAILED:
        state.last_error = detail
    state.next_attempt_at = None
    state.finished_at = at
    return record(state, event, status, at, detail)


def expect_reports_on(item: OutboxItemInput, state: OutboxItemState, addresses: list[str]) -> None:
    """Track each address the provider will report on as `pending` (when the destination listens
    for reports at all)."""
    if item.policy.report_window_s <= 0:
        return
    known = {recipient.address.casefold() for recipient in state.recipients}
    for address in addresses:
        if address.casefold() not in known:
            known.add(address.casefold())
            state.recipients.append(Recipient(address=address))


def note_recipient_results(
    item: OutboxItemInput, state: OutboxItemState, results: list[Recipient]
) -> None:
    """Show what the submit's answer said of some recipients (a number the provider refused),
    where reports on the recipients are kept at all."""
    if item.policy.report_window_s <= 0:
        return
    for result in results:
        address = result.address.casefold()
        recipient = next((r for r in state.recipients if r.address.casefold() == address), None)
        if recipient is None:
            state.recipients.append(dataclasses.replace(result))
        else:
            recipient.status, recipient.detail = result.status, result.detail


# How an event says the provider's lookup found the item (the reconcile step).
FOUND_BY_LOOKUP = "found by lookup: an earlier attempt's send, its answer lost"


def apply_submit_result(
    item: OutboxItemInput, state: OutboxItemState, result: SubmitResult, at: datetime
) -> bool:
    """The provider took the item: delivered at once, or accepted as an operation to poll.
    Whether the status changed."""
    state.provider_message_id = result.provider_message_id
    expect_reports_on(item, state, result.recipients)
    note_recipient_results(item, state, result.recipient_results)
    if result.delivered:
        detail = "delivered"
        if result.found_by_lookup:
            detail += f" ({FOUND_BY_LOOKUP})"
        return finish(state, ItemStatus.SENT, ItemEventType.SENT, at, detail)
    state.operation_url = result.operation_url
    state.operation_started_at = at
    delay = item.policy.poll_interval_s if result.retry_after_s is None else result.retry_after_s
    state.next_attempt_at = at + timedelta(seconds=delay)
    detail = f"operation {result.operation_url}"
    if result.found_by_lookup:
        detail += f" ({FOUND_BY_LOOKUP})"
    return record(state, ItemEventType.ACCEPTED, ItemStatus.SENDING, at, detail)


def schedule_next_poll(
    item: OutboxItemInput, state: OutboxItemState, at: datetime, retry_after_s: float | None
) -> None:
    """When to poll next: the provider's Retry-After, else the policy's growing interval."""
    policy = item.policy
    if retry_after_s is not None:
        delay = retry_after_s
    else:
        delay = min(
            policy.poll_interval_s * policy.poll_backoff_multiplier ** max(state.poll_count - 1, 0),
            policy.poll_interval_max_s,
        )
    state.next_attempt_at = at + timedelta(seconds=delay)


def apply_poll_result(
    item: OutboxItemInput, state: OutboxItemState, result: PollResult, at: datetime
) -> bool:
    """Apply a poll that saw the operation running or succeeded; False (nothing applied) for
    one that failed or was cancelled, which ends the item by the failure path."""
    if result.status in (OperationStatus.RUNNING, OperationStatus.NOT_STARTED):
        schedule_next_poll(item, state, at, result.retry_after_s)
        record(state, ItemEventType.POLLED, ItemStatus.SENDING, at, result.status.value)
        return True
    if result.status is OperationStatus.SUCCEEDED:
        finish(state, ItemStatus.SENT, ItemEventType.SENT, at, "operation succeeded")
        return True
    return False


def starts_item(events: list[ItemEvent]) -> bool:
    """Whether these events begin a generation (its payload is stored with them)."""
    return bool(events) and events[0].type in (ItemEventType.ENQUEUED, ItemEventType.REDRIVEN)


def projection(
    item_id: str,
    item: OutboxItemInput,
    state: OutboxItemState,
    payload: dict[str, Any] | None = None,
) -> ItemProjection:
    """The read model's write for the state's unprojected events (`payload`: the item's, when
    they begin a generation; defaults to the input's)."""
    events = list(state.events)
    return ItemProjection(
        view=OutboxItemView.of(item_id, item, state),
        events=events,
        enqueued_at=item.enqueued_at,
        payload=(item.payload if payload is None else payload) if starts_item(events) else None,
    )


def describe_enqueue(item: OutboxItemInput) -> str:
    """The `enqueued` event's detail."""
    if item.not_before is not None:
        return f"to {item.destination}, not before {item.not_before.isoformat()}"
    if item.debounce is not None:
        return f"to {item.destination}, in debounce window {item.debounce.key}"
    return f"to {item.destination}"


def enqueued(item_id: str, item: OutboxItemInput) -> ItemProjection:
    """The `queued` row an enqueuer writes right after starting the item (the workflow records
    the same event at the same time, `enqueued_at`, and leaves its projection to the enqueuer and
    the first submit)."""
    assert item.enqueued_at is not None, "an enqueuer-projected item has its enqueue time"
    state = OutboxItemState(started=True, created_at=item.enqueued_at)
    record(
        state, ItemEventType.ENQUEUED, ItemStatus.QUEUED, item.enqueued_at, describe_enqueue(item)
    )
    return projection(item_id, item, state)


def for_activity(item: OutboxItemInput, state: OutboxItemState) -> ProjectionContext:
    """What an activity needs to apply a transition and project it: the input without its
    payload (the request carries it once) and a copy of the state."""
    return ProjectionContext(
        item=dataclasses.replace(item, payload={}, state=None),
        state=dataclasses.replace(
            state,
            recipients=[dataclasses.replace(r) for r in state.recipients],
            events=list(state.events),
        ),
    )


def left_window(
    item_id: str,
    item: OutboxItemInput,
    status: ItemStatus,
    event: ItemEventType,
    at: datetime,
    detail: str,
    superseded_by: str | None = None,
) -> ItemProjection:
    """A debounce window's member ending without a workflow of its own: superseded by its
    window's carrier, or cancelled while it waited. The events begin with its `enqueued` (the
    same the enqueuer wrote, which the read model keeps), so a row the enqueuer could not write
    is whole too; no payload: the enqueuer's row holds it."""
    assert item.enqueued_at is not None, "a window's member has its enqueue time"
    state = OutboxItemState(started=True, created_at=item.enqueued_at)
    record(
        state, ItemEventType.ENQUEUED, ItemStatus.QUEUED, item.enqueued_at, describe_enqueue(item)
    )
    state.superseded_by = superseded_by
    finish(state, status, event, at, detail)
    return ItemProjection(
        view=OutboxItemView.of(item_id, item, state),
        events=list(state.events),
        enqueued_at=item.enqueued_at,
    )
