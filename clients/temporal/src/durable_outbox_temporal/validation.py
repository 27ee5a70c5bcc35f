"""Argument checks shared by the client and the REST API: the rules of
`durable_outbox_temporal.contract.limits`,
raising the client's `InvalidRequest`."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from durable_outbox_temporal.contract import limits
from durable_outbox_temporal.contract.priority import HIGHEST_PRIORITY, LOWEST_PRIORITY
from durable_outbox_temporal.errors import InvalidRequest, UnknownDestination

if TYPE_CHECKING:
    from durable_outbox_temporal.destinations import DestinationRegistry

# How deeply arrays and objects may nest in a payload or any JSON the API takes: far beyond any
# provider's body, and far below the depth where a recursive walk (a JSON encoder, pydantic, the
# payload codec, a template's placeholders) meets Python's recursion limit.
MAX_JSON_DEPTH = 64

# A surrogate code point only ever appears alone: a JSON decoder pairs the escapes of one
# character outside the Basic Multilingual Plane into that character.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

DELAYED_LANE_ITEM = (
    "not_before and delay_seconds cannot be combined with ordering_key: a delayed item would"
    " hold up every item behind it in its lane"
)


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


def validate_purge(outbox: str, destination: str | None, destinations: DestinationRegistry) -> None:
    """Raises `InvalidRequest` for an invalid outbox name, `UnknownDestination` for a
    `destination` (None: every one) not in `destinations`: what a purge of the outbox asks."""
    validate_outbox(outbox)
    if destination is not None and destinations.get(destination) is None:
        raise UnknownDestination(f"unknown destination {destination!r}")


def validate_not_before(not_before: datetime, now: datetime) -> datetime:
    """`not_before` if the item can be delayed until then; raises `InvalidRequest` otherwise."""
    validate_utc_date(not_before, "not_before")
    try:
        return limits.check_not_before(not_before, now)
    except ValueError as err:
        raise InvalidRequest(str(err)) from None


def validate_utc_date(value: datetime, name: str) -> datetime:
    """`value` in UTC (naive: UTC); raises `InvalidRequest` if that leaves years 1-9999, as an
    offset can (`0001-01-01T00:00:00+14:00`), where no `datetime` and no database can hold it."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise InvalidRequest(f"{name} must fall within years 1 to 9999 in UTC") from None


def validate_new_item(
    outbox: str,
    key: str,
    *,
    ordering_key: str | None,
    not_before: datetime | None,
    max_attempts: int | None,
    now: datetime,
    priority: int | None = None,
    payload: object = None,
) -> None:
    """The checks every way in applies to a new item (`OutboxClient.enqueue`, `enqueue_in`),
    except those that need the destinations (which the client checks, and the relay); the
    payload's nesting when it is given."""
    validate_outbox(outbox)
    validate_key(key)
    if ordering_key is not None:
        validate_ordering_key(ordering_key)
        if not_before is not None:
            raise InvalidRequest(DELAYED_LANE_ITEM)
    if max_attempts is not None and max_attempts < 1:
        raise InvalidRequest("max_attempts must be at least 1")
    if priority is not None and not (HIGHEST_PRIORITY <= priority <= LOWEST_PRIORITY):
        raise InvalidRequest(
            f"priority must be {HIGHEST_PRIORITY} (first) to {LOWEST_PRIORITY} (last)"
        )
    if not_before is not None:
        validate_not_before(not_before, now)
    if payload is not None:
        validate_json_depth(payload)
        validate_json_values(payload)


def validate_json_depth(document: object, what: str = "payload") -> None:
    """Raises `InvalidRequest` when arrays and objects nest deeper than `MAX_JSON_DEPTH` in
    `document`; walks it without recursion, so any depth is safe to check."""
    pending: list[tuple[object, int]] = [(document, 1)]
    while pending:
        node, depth = pending.pop()
        if isinstance(node, dict):
            children: Iterable[object] = node.values()
        elif isinstance(node, list | tuple):
            children = node
        else:
            continue
        if depth > MAX_JSON_DEPTH:
            raise InvalidRequest(
                f"{what} nests arrays and objects more than {MAX_JSON_DEPTH} levels deep"
            )
        pending.extend((child, depth + 1) for child in children)


def validate_json_values(document: object, what: str = "payload") -> None:
    """Raises `InvalidRequest` naming the first value of `document` that no provider can be sent
    as JSON (see `unsendable_json_value`)."""
    found = unsendable_json_value(document)
    if found is not None:
        path, problem = found
        raise InvalidRequest(f"{json_path(what, path)} is {problem}")


def unsendable_json_value(document: object) -> tuple[tuple[str | int, ...], str] | None:
    """The path to a value of `document` that no JSON body can carry, and why; None when there
    is none. That is a string (or an object's key) holding a lone surrogate, which is not
    Unicode and has no UTF-8 form, or a number that is not finite (`NaN`, `Infinity`, or
    `1e400` once parsed), which JSON has no way to write. Walks it without recursion."""
    pending: list[tuple[object, tuple[str | int, ...]]] = [(document, ())]
    while pending:
        node, path = pending.pop()
        if isinstance(node, str):
            if _LONE_SURROGATE.search(node):
                return path, "not valid Unicode: it holds a lone surrogate"
        elif isinstance(node, float):
            if not math.isfinite(node):
                return (
                    path,
                    "not a finite number (NaN, Infinity, or past 1.8e308), which JSON cannot carry",
                )
        elif isinstance(node, dict):
            for key, child in node.items():
                if isinstance(key, str) and _LONE_SURROGATE.search(key):
                    # The key itself is left out of the path: no answer could carry it.
                    return path, "an object whose key is not valid Unicode (a lone surrogate)"
                pending.append((child, (*path, key)))
        elif isinstance(node, list | tuple):
            pending.extend((child, (*path, index)) for index, child in enumerate(node))
    return None


def json_path(root: str, path: tuple[str | int, ...]) -> str:
    """`root.key[0].other`: where a value is in a document, as a reader writes it."""
    return root + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path)
