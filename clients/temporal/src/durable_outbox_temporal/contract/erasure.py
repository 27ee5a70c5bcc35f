"""The erase batch's contract: erase, page by page, every ended item a filter selects.

`POST .../items:erase` starts an `EraseBatch` workflow (`erase-batch/{outbox}/{batch id}`) and
answers at once with its status URL: an outbox's items with a key prefix, or those enqueued
for one subject (its keyed digest travels, never the subject itself). Each page erases its
items as `DELETE .../items/{key}/payload` would; items still under way are skipped and counted
with the reason. Its progress lives in Temporal (the `progress` query, then the result), so any
API instance follows it and a crashed page is simply run again. Plain data only.
"""

# No `from __future__ import annotations`: Temporal's converter reads real annotations.
from dataclasses import dataclass, field
from datetime import datetime

ERASE_BATCH_WORKFLOW_TYPE = "EraseBatch"
ERASE_PAGE_ACTIVITY = "erase_page"
# Items erased per activity: each is one transaction in the read model.
ERASE_PAGE_SIZE = 100
# Skipped keys a batch names in its progress (with why); `skipped` counts them all.
MAX_REPORTED_SKIPS = 100


def erase_batch_workflow_id(outbox: str, batch_id: str) -> str:
    """An erase batch: `erase-batch/{outbox}/{batch_id}`."""
    return f"erase-batch/{outbox}/{batch_id}"


@dataclass
class SkippedItem:
    """An item a batch left as it was, and why (it is under way, say)."""

    key: str
    reason: str


@dataclass
class EraseBatchProgress:
    """What an erase batch selects and how far it is: items erased, items skipped (the first
    of them, with why, in `skips`), pages done; `done` once every page is. The workflow's
    `progress` query and its result. Exactly one of `key_prefix` and `subject_digest` is set."""

    outbox: str
    key_prefix: str | None = None
    subject_digest: str | None = None
    erased: int = 0
    skipped: int = 0
    pages: int = 0
    done: bool = False
    finished_at: datetime | None = None
    # Where the next page starts (keys in order); None before the first page.
    cursor: str | None = None
    skips: list[SkippedItem] = field(default_factory=list)
    # Why the batch stopped before its end (its pages failed past their retries); None else.
    failure: str | None = None


@dataclass
class EraseBatchInput:
    """Where an erase batch's pages run, and how far it got (carried across continue-as-new)."""

    operations_task_queue: str
    progress: EraseBatchProgress


@dataclass
class ErasePageRequest:
    outbox: str
    key_prefix: str | None
    subject_digest: str | None
    # The page takes keys after this one (None: the first page).
    cursor: str | None
    limit: int = ERASE_PAGE_SIZE


@dataclass
class ErasePageResult:
    erased: int
    skipped: list[SkippedItem]
    # Where the following page starts; None when this was the last.
    next_cursor: str | None
