"""The bulk mode's contract: shard workflows that each host many deliveries.

A destination with `mode = "bulk"` has no workflow per item: its items are held by
`shards` long-lived `BulkShard` workflows (`bulk/{destination}/{n}`), chosen by a stable hash
of the item id, each running the same delivery state machine as the item workflow for every item
it holds. Plain data only, like the rest of the contract.
"""

# No `from __future__ import annotations`: Temporal's converter reads these hints at run time.
import hashlib
from dataclasses import dataclass, field

from durable_outbox_temporal.contract.ids import item_workflow_id, lane_workflow_id
from durable_outbox_temporal.contract.item import CancelRequest, DeliveryReport, OutboxItemInput
from durable_outbox_temporal.contract.lane import LanePolicy, LaneState

SHARD_WORKFLOW_TYPE = "BulkShard"
# Items to hold (one signal may carry many: a batch enqueue sends one per shard).
ENQUEUE_SIGNAL = "enqueue_items"
# Cancel one held item if it is still queued (the item workflow's `request_cancel`, by id).
CANCEL_ITEM_SIGNAL = "cancel_item"
# A delivery report for one held item (routed by the item id the read model found).
ITEM_REPORT_SIGNAL = "item_delivery_report"
SHARD_QUERY = "shard"
# The shard's batched projections: one local activity writes a batch of items' transitions.
PROJECT_ITEMS_ACTIVITY = "project_items"
# A host's delivery reports for items it no longer holds, recorded in their read-model rows.
RECORD_LATE_REPORTS_ACTIVITY = "record_late_reports"

# Ids of the items a shard finished most recently, carried across continue-as-new so a repeated
# enqueue signal (a client's retry) does not deliver an item twice. Older repeats are answered
# by the read model before they reach the shard.
RECENT_KEPT = 5000
DEFAULT_SHARDS = 4
MAX_SHARDS = 64
# Submits or polls one batch activity carries at most.
MAX_BATCH = 100
# Items a shard admits in one workflow task, about (a lane counts one, and one for each item it
# holds; an enqueue signal is admitted whole while any room is left): what a continue-as-new
# carries beyond it goes in parts of as many (`ShardInput.later`), and enqueues beyond it that
# arrive together wait, unread, for later tasks. About 0.1 ms of a worker's CPU each. It decides
# a run's commands, so each run admits what its input names (`ShardInput.admit_per_task`, this
# value when it starts or continues as new): a release may change it, and the runs already
# going, replayed by that release, keep theirs.
# Why: docs/decisions/shard-carry-in-parts.md
ADMIT_PER_TASK = 1000
# What a run whose input names no value admits: every run started before the value was carried
# admitted this. Never to change (those runs' histories replay by it).
ADMIT_PER_TASK_UNNAMED = 1000


def admit_per_task() -> int:
    """What a run started now admits a task (`ShardInput.admit_per_task`): `ADMIT_PER_TASK`,
    read when asked (the tests lower it)."""
    return ADMIT_PER_TASK


# The memo naming the `shards` a shard was started under (a continue-as-new keeps its memo): a
# worker refuses to start with a destination's count changed while its shards hold items.
SHARDS_MEMO = "shards"


def shard_workflow_id(destination: str, shard: int) -> str:
    """`bulk/{destination}/{shard}`."""
    return f"bulk/{destination}/{shard}"


def shard_of(item_id: str, shards: int) -> int:
    """The shard that holds an item: stable across processes and Python versions."""
    digest = hashlib.sha256(item_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % shards


def owner_id(outbox: str, key: str, ordering_key: str | None) -> str:
    """What places an item in a shard: its own id, or its lane's id when it has an ordering key
    (every item of a key goes to the shard that owns the key, which keeps their order)."""
    if ordering_key is not None:
        return lane_workflow_id(outbox, ordering_key)
    return item_workflow_id(outbox, key)


@dataclass
class ShardInput:
    """A shard's start, and what it carries across continue-as-new."""

    destination: str
    shard: int
    # Polls and submits one activity carries at most (the destination's `poll_batch` and
    # `submit_batch`), carried across continue-as-new; each enqueue brings the configured ones.
    poll_batch: int = 1
    submit_batch: int = 1
    # The items it holds, each with its state (`OutboxItemInput.state`) when it had begun.
    items: list[OutboxItemInput] = field(default_factory=list)
    recent: list[str] = field(default_factory=list)
    # The ordering lanes it holds: their waiting items, and their heads where they were.
    lanes: list[LaneState] = field(default_factory=list)
    # An item-mode lane: how many of a destination's items one submit activity may carry, one
    # after another (its `lane_run`, as the latest append said); 1 for a destination not named.
    lane_runs: dict[str, int] = field(default_factory=dict)
    # Seconds it stays with nothing to do before it ends (the next item starts it again).
    linger_s: float = 30.0
    # It continues as new past this many history events, or when Temporal suggests it (None).
    continue_after_events: int | None = None
    # Held items and lanes beyond what one workflow task reads quickly: each the JSON text of a
    # `CarriedPart`, read and admitted one per workflow task after the first, so that no task
    # reads them all (the SDK fails a task that does not yield within 2 s). Text, so that the
    # run's input is read without building them. Why: docs/decisions/shard-carry-in-parts.md
    later: list[str] = field(default_factory=list)
    # Items this run admits in one workflow task (`ADMIT_PER_TASK` as its starter or the run
    # before knew it); None: `ADMIT_PER_TASK_UNNAMED`, as every run did before it was carried.
    admit_per_task: int | None = None


@dataclass
class CarriedPart:
    """Items and lanes a run admits in one of its later workflow tasks (`ShardInput.later`)."""

    items: list[OutboxItemInput] = field(default_factory=list)
    lanes: list[LaneState] = field(default_factory=list)


@dataclass
class ShardEnqueue:
    """Input of `enqueue_items`: the items, and the destination's batch sizes as configured now
    (None: keep the shard's)."""

    items: list[OutboxItemInput]
    poll_batch: int | None = None
    submit_batch: int | None = None
    # The lane policy of each outbox whose items have an ordering key (a new lane takes it).
    lane_policies: dict[str, LanePolicy] = field(default_factory=dict)


@dataclass
class ItemCancel:
    """Input of `cancel_item`."""

    item_id: str
    request: CancelRequest


@dataclass
class ItemReport:
    """Input of `item_delivery_report`."""

    item_id: str
    report: DeliveryReport


@dataclass
class ShardView:
    """What the `shard` query answers: how many items, by status."""

    destination: str
    shard: int
    held: int
    by_status: dict[str, int]
    finished: int
    # Ordering lanes held, and the items in them (heads included).
    lanes: int = 0
    in_lanes: int = 0
