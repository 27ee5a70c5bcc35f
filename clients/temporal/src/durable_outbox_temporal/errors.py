"""The errors `OutboxClient` raises; the REST API maps each one to a single problem+json status."""

from __future__ import annotations

from temporalio.client import RPCTimeoutOrCancelledError
from temporalio.service import RPCError, RPCStatusCode

# What the cluster answers when it is down, overloaded or throttling the namespace: retrying
# later is the fix, unlike a refusal of the request itself.
_UNAVAILABLE_CODES = (
    RPCStatusCode.UNAVAILABLE,
    RPCStatusCode.DEADLINE_EXCEEDED,
    RPCStatusCode.RESOURCE_EXHAUSTED,
)


class OutboxError(Exception):
    """Base of the client's errors; `reason` names the refusal more precisely where the domain
    has a name for it (an aggregate's `SeatTaken`)."""

    def __init__(self, *args: object, reason: str | None = None) -> None:
        super().__init__(*args)
        self.reason = reason


class InvalidRequest(OutboxError):
    """The outbox name, key or another argument is malformed."""


class PayloadTooLarge(InvalidRequest):
    """The payload is over its destination's size limit (an `http` destination's
    `max_body_bytes`)."""


class UnknownDestination(OutboxError):
    """No destination of that name is configured."""


class IdempotencyConflict(OutboxError):
    """The key is already used by an item with a different destination, payload or lane."""


class ItemFailedUseRedrive(OutboxError):
    """The key belongs to an item that failed permanently; redrive it instead of re-enqueueing."""


class ItemNotFound(OutboxError):
    """No item with that outbox and key exists."""


class CannotCancel(OutboxError):
    """The item is past the point where cancelling could stop it."""


class NotRedrivable(OutboxError):
    """Only failed (or terminated, or timed-out) items can be redriven."""


class ItemErased(OutboxError):
    """The item's payload was erased: it cannot be redriven (there is nothing to send)."""


class PayloadPruned(OutboxError):
    """The item's payload was pruned by retention: it cannot be redriven (there is nothing to
    send)."""


class NotErasable(OutboxError):
    """Only an ended (sent, failed or cancelled) item's payload can be erased."""


class LaneFull(OutboxError):
    """The item's ordering lane carries as many waiting items as it can; retry later."""


class LaneNotFound(OutboxError):
    """No running ordering lane of that outbox and key (it never ran, or ended when idle)."""


class LaneNotHalted(OutboxError):
    """Only a halted lane's head item can be redriven or skipped through the lane."""


class TemporalUnavailable(OutboxError):
    """The Temporal cluster could not be reached; retrying later may succeed."""


def is_temporal_unavailable(err: BaseException) -> bool:
    """Whether `err` means Temporal did not answer (down, timed out, throttling), by its type."""
    if isinstance(err, TemporalUnavailable | RPCTimeoutOrCancelledError):
        return True
    return isinstance(err, RPCError) and err.status in _UNAVAILABLE_CODES


class UnknownAggregate(OutboxError):
    """No aggregate type (or no aggregate with that id) of that name exists."""


class UnknownCommand(OutboxError):
    """The aggregate type has no command of that name."""


class CommandConflict(OutboxError):
    """The aggregate refused the command: it clashes with its state or the expected version."""


class InvalidCommand(OutboxError):
    """The command's payload does not fit, or the aggregate says it can never succeed."""


class UnknownEffect(OutboxError):
    """The aggregate's effect ledger holds no effect with that key."""


class EffectNotFailed(OutboxError):
    """Only a failed effect can be retried; this one is pending or done."""


def check_same_request(existing_hash: str | None, requested_hash: str) -> None:
    """Raise `IdempotencyConflict` unless the key's item was asked for with the same request."""
    if existing_hash != requested_hash:
        raise IdempotencyConflict(
            "this Idempotency-Key is already used by an item with a different destination,"
            " payload or ordering key"
        )


def failed_use_redrive() -> ItemFailedUseRedrive:
    """The answer to re-enqueueing a key whose item failed permanently."""
    return ItemFailedUseRedrive(
        "the item with this Idempotency-Key failed permanently; redrive it to try again"
    )
