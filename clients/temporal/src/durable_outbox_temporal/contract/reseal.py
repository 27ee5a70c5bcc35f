"""The reseal batch's contract: every sealed value of the read model sealed again under the
newest payload key, so an older key can be removed (`contract.sealing`).

`POST /v1/sealed-values:reseal` starts a `ResealBatch` workflow (`reseal-batch/{batch id}`) and
answers at once; its pages walk each table holding sealed columns in primary-key order, and its
progress lives in Temporal (the `progress` query, then the result), so any API instance follows
it and a worker crash retries only the page in flight. Plain data only.
"""

# No `from __future__ import annotations`: Temporal's converter reads real annotations.
from dataclasses import dataclass, field
from datetime import datetime

RESEAL_BATCH_WORKFLOW_TYPE = "ResealBatch"
RESEAL_PAGE_ACTIVITY = "reseal_page"
# Rows read (and those under an older key rewritten) per activity, in one transaction.
RESEAL_PAGE_SIZE = 500
# Values a batch names in its progress as not resealed (with why); `unreadable` counts them all.
MAX_REPORTED_UNREADABLE = 20

# A primary key's values, in the table's key order (text and integers only).
RowKey = list[str | int]


def reseal_batch_workflow_id(batch_id: str) -> str:
    """A reseal batch: `reseal-batch/{batch_id}`."""
    return f"reseal-batch/{batch_id}"


@dataclass
class ResealBatchProgress:
    """How far a reseal batch is: values sealed again under `key_id` (`resealed`), values it
    could not open (`unreadable`: a key no longer configured, the first few named in
    `errors`), pages done; `done` once every table is walked. The workflow's `progress` query
    and its result."""

    # The key the batch seals under: the newest (current) one when it started.
    key_id: str | None = None
    resealed: int = 0
    unreadable: int = 0
    pages: int = 0
    done: bool = False
    finished_at: datetime | None = None
    # The table being walked, and the primary key the next page starts after (None: its start).
    table: str | None = None
    cursor: RowKey | None = None
    # Tables walked to their end, in order.
    tables_done: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # Why the batch stopped before its end (its pages failed past their retries); None else.
    failure: str | None = None


@dataclass
class ResealBatchInput:
    """Where a reseal batch's pages run, and how far it got (carried across continue-as-new)."""

    operations_task_queue: str
    progress: ResealBatchProgress


@dataclass
class ResealPageRequest:
    # The table to walk (None: the first table with sealed columns) and the primary key the page
    # starts after (None: the table's start).
    table: str | None
    cursor: RowKey | None
    limit: int = RESEAL_PAGE_SIZE


@dataclass
class ResealPageResult:
    # The key the page sealed under (the worker's current key) and the table it walked.
    key_id: str
    table: str
    resealed: int
    unreadable: list[str]
    # Where the next page starts: `table` again after `next_cursor`, or the next table from its
    # start (cursor None); `next_table` None when every table is walked.
    next_table: str | None
    next_cursor: RowKey | None
