"""Dead letters' contract: which failed items a filter selects, and the redrive batch.

A dead letter is an item that failed permanently (status `failed`). Operators list them, redrive
one, discard one (kept for audit, out of the list), or redrive every one a filter selects as a
batch: a `RedriveBatch` workflow (`redrive-batch/{outbox}/{batch id}`) that pages through the
dead letters failed before the batch began, so items that fail again are not picked up twice.
Its progress lives in Temporal, so it survives any API restart. Plain data only.
"""

# No `from __future__ import annotations`: Temporal's converter reads real annotations.
from dataclasses import dataclass, field
from datetime import datetime

REDRIVE_BATCH_WORKFLOW_TYPE = "RedriveBatch"
REDRIVE_PAGE_ACTIVITY = "redrive_dead_letter_page"
# Query: the batch's progress (`RedriveBatchProgress`).
PROGRESS_QUERY = "progress"
# Dead letters redriven per activity: one page of the read model at a time.
REDRIVE_PAGE_SIZE = 100


@dataclass
class DeadLetterFilter:
    """Which dead letters: of one destination, with one provider error code, failed in
    `[failed_from, failed_to)`. Every field is optional; none selects them all."""

    destination: str | None = None
    error_code: str | None = None
    failed_from: datetime | None = None
    failed_to: datetime | None = None


@dataclass
class RedriveBatchProgress:
    """What a redrive batch selects and how far it is: items started again, items it could not
    redrive when it reached them (redriven meanwhile, say), pages done; `done` once every page
    is. The workflow's `progress` query and its result."""

    outbox: str
    filter: DeadLetterFilter
    # The batch takes dead letters that failed before it began (by the workflows' clock, the
    # one item failures are stamped with): not the ones it redrives and that fail again, which
    # would otherwise be taken again and again. Set by the batch's first run.
    failed_before: datetime | None = None
    redriven: int = 0
    skipped: int = 0
    pages: int = 0
    done: bool = False
    finished_at: datetime | None = None
    # Where the next page starts (the read model's keyset cursor); None before the first page.
    cursor: str | None = None
    # The first keys that could not be redriven, with why (capped: the progress is small).
    errors: list[str] = field(default_factory=list)


@dataclass
class RedriveBatchInput:
    """Where a redrive batch's pages run, and what it selects and how far it got (all zero at
    the start; carried across continue-as-new)."""

    operations_task_queue: str
    progress: RedriveBatchProgress


@dataclass
class RedrivePageRequest:
    outbox: str
    filter: DeadLetterFilter
    failed_before: datetime
    cursor: str | None
    limit: int = REDRIVE_PAGE_SIZE


@dataclass
class RedrivePageResult:
    redriven: list[str]
    skipped: int
    # Where the following page starts; None when this was the last.
    next_cursor: str | None
    errors: list[str] = field(default_factory=list)
