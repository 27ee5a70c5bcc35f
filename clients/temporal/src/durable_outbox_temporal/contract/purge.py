"""The purge batch's contract: cancel, page by page, every item of an outbox not yet submitted.

`POST .../items:purge` starts a `PurgeBatch` workflow (`purge-batch/{outbox}/{batch id}`) and
answers at once: a cancel may wait for a worker, so a purge of many items outlives any HTTP
request. Its progress lives in Temporal (the `progress` query, then the result), so any API
instance follows it. Plain data only.
"""

# No `from __future__ import annotations`: Temporal's converter reads real annotations.
from dataclasses import dataclass, field
from datetime import datetime

PURGE_BATCH_WORKFLOW_TYPE = "PurgeBatch"
PURGE_PAGE_ACTIVITY = "purge_page"
# Items cancelled per activity (at most: fewer where some are handed over meanwhile).
PURGE_PAGE_SIZE = 100
# Cancelled keys a batch names in its progress; `cancelled` counts them all.
MAX_REPORTED_KEYS = 1000


def purge_batch_workflow_id(outbox: str, batch_id: str) -> str:
    """A purge batch: `purge-batch/{outbox}/{batch_id}`."""
    return f"purge-batch/{outbox}/{batch_id}"


@dataclass
class PurgeBatchProgress:
    """What a purge batch cancels and how far it is: items cancelled (their first keys in
    `keys`), items it found handed to the provider or ended when it reached them (`skipped`),
    pages done; `done` once every page is. The workflow's `progress` query and its result."""

    outbox: str
    destination: str | None = None
    reason: str = "purged"
    cancelled: int = 0
    skipped: int = 0
    pages: int = 0
    done: bool = False
    finished_at: datetime | None = None
    # Where the next page starts (keys in order); None before the first page.
    cursor: str | None = None
    keys: list[str] = field(default_factory=list)
    # Why the batch stopped before its end (its pages failed past their retries); None else.
    failure: str | None = None


@dataclass
class PurgeBatchInput:
    """Where a purge batch's pages run, and how far it got (carried across continue-as-new)."""

    operations_task_queue: str
    progress: PurgeBatchProgress


@dataclass
class PurgePageRequest:
    outbox: str
    destination: str | None
    reason: str
    # The page takes keys after this one (None: the first page, which empties the lanes too).
    cursor: str | None
    limit: int = PURGE_PAGE_SIZE


@dataclass
class PurgePageResult:
    cancelled: list[str]
    skipped: int
    # Where the following page starts; None when this was the last.
    next_cursor: str | None
