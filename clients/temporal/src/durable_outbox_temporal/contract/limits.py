"""The rules names, keys and due times must follow, written once; the API, the client and config
use them.

Each check raises `ValueError` with a message that says what to fix; callers wrap it in their
own error type (the client's `InvalidRequest`, a pydantic validation error, a config error).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

MAX_OUTBOX_LENGTH = 100
MAX_KEY_LENGTH = 200
# A destination names two task queues and a DNS-like label in configs and env var names.
MAX_DESTINATION_LENGTH = 63
# `outbox/{outbox}/{key}` with room to spare.
MAX_ITEM_ID_LENGTH = 320
# A provider's `Retry-After` up to its `max_retry_after_s` (this by default) is waited exactly;
# a longer one fails the item (a wait of days is a refusal, and one of years would overflow the
# timer's date).
DEFAULT_MAX_RETRY_AFTER_S = 3600.0
# A `not_before` becomes the workflow's start delay, and the Temporal server silently caps any
# delay (and timer) at 100 years of 365 days (`MaxAllowedTimer` in its `common/timer`), so a
# later due time would be honoured thousands of years early. Refused instead.
MAX_START_DELAY = timedelta(days=100 * 365)

OUTBOX_NAME_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_OUTBOX_LENGTH - 1}}}$"
DESTINATION_NAME_PATTERN = rf"^[a-z0-9][a-z0-9-]{{0,{MAX_DESTINATION_LENGTH - 1}}}$"
# Printable characters only (keys are part of workflow ids shown in UIs and logs), and no "/",
# so an idempotency key is always exactly one URL path segment in the REST API, and an ordering
# key one segment of its lane's id and URL.
TEXT_KEY_PATTERN = rf"^[^\x00-\x1f\x7f/]{{1,{MAX_KEY_LENGTH}}}$"
# A subject an item is enqueued for (an email address, a customer id): printable, any length an
# address may have. Stored only as a keyed digest (`readmodel/subjects.py`).
MAX_SUBJECT_LENGTH = 320
SUBJECT_PATTERN = rf"^[^\x00-\x1f\x7f]{{1,{MAX_SUBJECT_LENGTH}}}$"

_OUTBOX_NAME = re.compile(OUTBOX_NAME_PATTERN)
_DESTINATION_NAME = re.compile(DESTINATION_NAME_PATTERN)
_TEXT_KEY = re.compile(TEXT_KEY_PATTERN)


def check_outbox_name(outbox: str) -> str:
    """`outbox` if it is a valid outbox name; raises ValueError otherwise."""
    if not _OUTBOX_NAME.match(outbox):
        raise ValueError(
            f"outbox name must be 1-{MAX_OUTBOX_LENGTH} letters, digits, '.', '_' or '-',"
            " starting with a letter or digit"
        )
    return outbox


def check_destination_name(name: str) -> str:
    """`name` if it is a valid destination name; raises ValueError otherwise."""
    if not _DESTINATION_NAME.match(name):
        raise ValueError(
            f"destination name must be lower-case letters, digits and '-', starting with a letter"
            f" or digit, at most {MAX_DESTINATION_LENGTH} characters"
        )
    return name


def check_idempotency_key(key: str) -> str:
    """`key` if it is a valid idempotency key; raises ValueError otherwise."""
    _check_text_key(key, "idempotency key")
    # The key is the last segment of the item's URL: "." and ".." would make that path climb a
    # level once any client normalises it.
    if key in (".", ".."):
        raise ValueError(f"idempotency key {key!r} cannot be addressed in a URL path")
    return key


def check_ordering_key(ordering_key: str) -> str:
    """`ordering_key` if it is a valid ordering key; raises ValueError otherwise."""
    _check_text_key(ordering_key, "ordering key")
    # The key is the last segment of its lane's URL (`.../lanes/{ordering_key}`).
    if ordering_key in (".", ".."):
        raise ValueError(f"ordering key {ordering_key!r} cannot be addressed in a URL path")
    return ordering_key


def check_concurrency_key(concurrency_key: str) -> str:
    """`concurrency_key` if it is a valid concurrency key (a tenant, a customer); raises
    ValueError otherwise."""
    return _check_text_key(concurrency_key, "concurrency key")


def _check_text_key(value: str, what: str) -> str:
    # isprintable() also refuses lone surrogates, which no UTF-8 workflow id can carry.
    if not _TEXT_KEY.match(value) or not value.isprintable():
        raise ValueError(f"{what} must be 1-{MAX_KEY_LENGTH} printable characters other than '/'")
    return value


def check_not_before(not_before: datetime, now: datetime) -> datetime:
    """`not_before` if it is time-zone aware and the engine can wait until it; ValueError
    otherwise."""
    if not_before.tzinfo is None or not_before.utcoffset() is None:
        raise ValueError("not_before must be time-zone aware")
    latest = now + MAX_START_DELAY
    if not_before > latest:
        raise ValueError(
            f"not_before must be at most {MAX_START_DELAY.days} days from now (no later than"
            f" {latest.isoformat(timespec='seconds')}): Temporal cannot delay an item longer"
        )
    return not_before
