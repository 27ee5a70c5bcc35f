"""The replay batch's contract: send again, as new items, the items a filter selects.

`POST .../replays` starts a `ReplayBatch` workflow (`replay-batch/{outbox}/{replay id}`) that
pages through the read model's items created before it began and enqueues, for each, a new item
to the target destination keyed `replay:{replay id}:{original key}` (`replay_key`): running the
same replay again finds those keys taken and adds nothing. Its progress lives in Temporal, so
any API instance follows it. Plain data only.
"""

# No `from __future__ import annotations`: Temporal's converter reads real annotations.
import hashlib
from dataclasses import dataclass, field
from datetime import datetime

from durable_outbox_temporal.contract.limits import MAX_KEY_LENGTH

REPLAY_BATCH_WORKFLOW_TYPE = "ReplayBatch"
REPLAY_PAGE_ACTIVITY = "replay_page"
# Items replayed per activity: one page of the read model at a time.
REPLAY_PAGE_SIZE = 100
# The prefix of every replayed item's key.
REPLAY_KEY_PREFIX = "replay:"


def replay_batch_workflow_id(outbox: str, replay_id: str) -> str:
    """A replay batch: `replay-batch/{outbox}/{replay_id}`."""
    return f"replay-batch/{outbox}/{replay_id}"


def replay_key(replay_id: str, original_key: str) -> str:
    """The replayed item's key: `replay:{replay id}:{original key}`, or, where that would pass
    the key length limit, the original key's SHA-256 in its place (the link table keeps the
    original's key either way)."""
    key = f"{REPLAY_KEY_PREFIX}{replay_id}:{original_key}"
    if len(key) <= MAX_KEY_LENGTH:
        return key
    digest = hashlib.sha256(original_key.encode()).hexdigest()
    return f"{REPLAY_KEY_PREFIX}{replay_id}:sha256:{digest}"


@dataclass
class ReplayFilter:
    """Which items: of one destination, in these statuses, created in `[created_from,
    created_to)`, with keys starting `key_prefix`. Every field is optional; none selects every
    item of the outbox."""

    destination: str | None = None
    statuses: list[str] | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None
    key_prefix: str | None = None


@dataclass
class ReplayBatchProgress:
    """What a replay selects, where it sends them and how far it is: new items enqueued
    (`replayed`), items whose replay existed already (`already`: a repeat of the replay),
    items skipped because their payload was erased or is gone from the read model, pages done;
    `done` once every page is. The workflow's `progress` query and its result."""

    outbox: str
    filter: ReplayFilter
    target: str
    # It takes items created before it began (by the workflows' clock), never its own new ones
    # where the target is the filter's destination. Set by the batch's first run.
    created_before: datetime | None = None
    replayed: int = 0
    already: int = 0
    erased: int = 0
    pruned: int = 0
    pages: int = 0
    done: bool = False
    finished_at: datetime | None = None
    # Where the next page starts (the read model's keyset cursor); None before the first page.
    cursor: str | None = None
    # The first keys that could not be replayed, with why (capped: the progress is small).
    errors: list[str] = field(default_factory=list)
    # Why the batch stopped before its end (its pages failed past their retries); None else.
    failure: str | None = None


@dataclass
class ReplayBatchInput:
    """Where a replay's pages run, its id (the new items' keys carry it), and how far it got
    (carried across continue-as-new)."""

    operations_task_queue: str
    replay_id: str
    progress: ReplayBatchProgress


@dataclass
class ReplayPageRequest:
    outbox: str
    replay_id: str
    filter: ReplayFilter
    target: str
    created_before: datetime
    cursor: str | None
    limit: int = REPLAY_PAGE_SIZE


@dataclass
class ReplayPageResult:
    replayed: int
    already: int
    erased: int
    pruned: int
    # Where the following page starts; None when this was the last.
    next_cursor: str | None
    errors: list[str] = field(default_factory=list)
