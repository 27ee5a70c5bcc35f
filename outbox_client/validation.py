"""Argument checks shared by the client and the REST API: the rules of `contract.limits`,
raising the client's `InvalidRequest`."""

from __future__ import annotations

from datetime import datetime

from contract import limits
from outbox_client.errors import InvalidRequest


def validate_outbox(outbox: str) -> str:
    """`outbox` if it is a valid outbox name; raises `InvalidRequest` otherwise."""
    try:
        return limits.check_outbox_name(outbox)
    except ValueError as err:
        raise InvalidRequest(str(err)) from None


def validate_key(key: str) -> str:
    """`key` if it is a valid idempotency key; raises `InvalidRequest` otherwise."""
    try:
        return limits.check_idempotency_key(key)
    except ValueError as err:
        raise InvalidRequest(str(err)) from None


def validate_ordering_key(ordering_key: str) -> str:
    """`ordering_key` if it is a valid ordering key; raises `InvalidRequest` otherwise."""
    try:
        return limits.check_ordering_key(ordering_key)
    except ValueError as err:
        raise InvalidRequest(str(err)) from None


def validate_not_before(not_before: datetime, now: datetime) -> datetime:
    """`not_before` if the item can be delayed until then; raises `InvalidRequest` otherwise."""
    try:
        return limits.check_not_before(not_before, now)
    except ValueError as err:
        raise InvalidRequest(str(err)) from None
