"""Scheduled fan-out's contract: the batch template, its placeholders and its item keys.

A Temporal Schedule (`schedule/{id}`) starts one `ScheduledBatch` workflow per fire time; that
workflow has the operations worker enqueue the schedule's items. Each item's idempotency key is
`{id}:{fire time}:{suffix}`, derived from the *scheduled* fire time (the
`TemporalScheduledStartTime` the schedule stamps on the run), never the time it actually ran, so a
retried or re-run fire enqueues every item once. Plain data and pure functions only: the
workflow, the service and the API all import this module.
"""

# No `from __future__ import annotations`: Temporal's converter reads real annotations.
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any
from zoneinfo import ZoneInfo

from temporalio.common import SearchAttributeKey

SCHEDULED_BATCH_WORKFLOW_TYPE = "ScheduledBatch"
ENQUEUE_SCHEDULED_BATCH_ACTIVITY = "enqueue_scheduled_batch"
# `ApplicationError.type` of a fire that could not enqueue every item (details: `FireResult`).
BATCH_INCOMPLETE_ERROR = "ScheduledBatchIncomplete"
# `ApplicationError.type` of a ScheduledBatch run that no schedule started (no fire time).
NOT_SCHEDULED_ERROR = "NotScheduled"

# Set by the Temporal server on every workflow a schedule starts: the nominal fire time (for a
# manual trigger, the time of the trigger).
SCHEDULED_START_TIME = SearchAttributeKey.for_datetime("TemporalScheduledStartTime")

# Same bounds as a batch enqueue.
MAX_SCHEDULE_ITEMS = 100
MAX_SCHEDULE_ID_LENGTH = 100
MAX_KEY_SUFFIX_LENGTH = 64
SCHEDULE_ID_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_SCHEDULE_ID_LENGTH - 1}}}$"
KEY_SUFFIX_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_KEY_SUFFIX_LENGTH - 1}}}$"
# Temporal refuses shorter windows.
MIN_CATCHUP_WINDOW_S = 10
MAX_CATCHUP_WINDOW_S = 7 * 24 * 3600
DEFAULT_CATCHUP_WINDOW_S = 300
MAX_INTERVAL_S = 366 * 24 * 3600

# `{{name}}` in any string of an item's payload (keys of objects are left alone).
PLACEHOLDERS: Mapping[str, str] = {
    "scheduled_at": "the fire time, RFC 3339 in UTC (e.g. 2025-01-31T06:00:00Z)",
    "fire_date": "the fire time's date in the schedule's time zone (e.g. 2025-01-31)",
    "schedule_id": "the schedule's id",
    "item_key": "the item's idempotency key",
}
_PLACEHOLDER = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
_SCHEDULE_ID = re.compile(SCHEDULE_ID_PATTERN)
_KEY_SUFFIX = re.compile(KEY_SUFFIX_PATTERN)


class Overlap(StrEnum):
    """What a fire does while the previous fire's batch is still being enqueued."""

    SKIP = "skip"  # do not fire (the next fire time will)
    BUFFER_ONE = "buffer_one"  # fire once right after the running one ends


@dataclass
class ItemTemplate:
    """One item every fire enqueues; placeholders in its payload's strings are filled in."""

    destination: str
    payload: dict[str, Any]
    # The last part of the item's key; the item's index in the template when absent.
    key_suffix: str | None = None
    ordering_key: str | None = None
    max_attempts: int | None = None

    def suffix(self, index: int) -> str:
        return self.key_suffix if self.key_suffix is not None else str(index)


@dataclass
class ScheduledBatchInput:
    """The schedule's action argument: which outbox, which items, where to enqueue them from."""

    schedule_id: str
    outbox: str
    items: list[ItemTemplate]
    # The operations worker's task queue (the workflow worker runs no remote activities).
    operations_task_queue: str
    # IANA time zone of the schedule (`fire_date` is a date there); None means UTC.
    timezone: str | None = None


@dataclass
class FireRequest:
    """Input of the enqueue activity: the batch and the fire time it belongs to."""

    batch: ScheduledBatchInput
    scheduled_at: datetime


@dataclass
class FailedItem:
    """An item a fire could not enqueue, and why (retrying would not help)."""

    index: int
    key: str
    error: str
    message: str


@dataclass
class FireResult:
    """What one fire enqueued: `created` new items, `existing` ones a previous try of the same
    fire already had, and the items refused."""

    schedule_id: str
    scheduled_at: datetime
    created: int
    existing: int
    keys: list[str] = field(default_factory=list)
    failed: list[FailedItem] = field(default_factory=list)


def check_schedule_id(schedule_id: str) -> str:
    """`schedule_id` if valid; raises ValueError otherwise."""
    if not _SCHEDULE_ID.match(schedule_id):
        raise ValueError(
            f"schedule id must be 1-{MAX_SCHEDULE_ID_LENGTH} letters, digits, '.', '_' or '-',"
            " starting with a letter or digit"
        )
    return schedule_id


def check_key_suffix(suffix: str) -> str:
    """`suffix` if valid; raises ValueError otherwise."""
    if not _KEY_SUFFIX.match(suffix):
        raise ValueError(
            f"key_suffix must be 1-{MAX_KEY_SUFFIX_LENGTH} letters, digits, '.', '_' or '-',"
            " starting with a letter or digit"
        )
    return suffix


def item_key(schedule_id: str, scheduled_at: datetime, suffix: str) -> str:
    """The idempotency key of one item of one fire: `{id}:{YYYYMMDDTHHMMSSZ}:{suffix}`.

    Whole seconds, as in the id Temporal gives the fire's workflow, so two triggers within one
    second are one fire.
    """
    return f"{schedule_id}:{scheduled_at.astimezone(UTC):%Y%m%dT%H%M%SZ}:{suffix}"


def fire_values(
    schedule_id: str, scheduled_at: datetime, timezone: str | None, key: str
) -> dict[str, str]:
    """The value of each placeholder for one item of one fire."""
    local = scheduled_at.astimezone(ZoneInfo(timezone) if timezone else UTC)
    return {
        "scheduled_at": scheduled_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "fire_date": local.date().isoformat(),
        "schedule_id": schedule_id,
        "item_key": key,
    }


def unknown_placeholders(payload: Any) -> Iterator[tuple[list[str | int], str]]:
    """Each `(path, name)` of a placeholder in `payload` that `PLACEHOLDERS` does not define."""
    for path, text in _strings(payload, []):
        for match in _PLACEHOLDER.finditer(text):
            if match.group(1) not in PLACEHOLDERS:
                yield path, match.group(1)


def render(payload: Any, values: Mapping[str, str]) -> Any:
    """`payload` with every `{{name}}` in its strings replaced by `values[name]`."""
    if isinstance(payload, str):
        return _PLACEHOLDER.sub(lambda match: values[match.group(1)], payload)
    if isinstance(payload, dict):
        return {key: render(value, values) for key, value in payload.items()}
    if isinstance(payload, list):
        return [render(value, values) for value in payload]
    return payload


def _strings(value: Any, path: list[str | int]) -> Iterator[tuple[list[str | int], str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, inner in value.items():
            yield from _strings(inner, [*path, key])
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _strings(inner, [*path, index])
