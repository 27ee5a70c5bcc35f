"""Retention's contract: the `Retention` workflow a Temporal Schedule starts, which prunes
ended items' payloads and then their rows, rule by rule, a page at a time, then the rows of
ordering lanes idle past the longest item retention.

A rule is one destination's retention for every outbox without an override of its own, or one
outbox's override at one destination (`DestinationRegistry.retention`). The schedule
(`retention/{workflow task queue}`) is created by the worker at start; each run plans the rules
from the worker's destinations, then walks them with a cutoff fixed at its start, so a run
retried or continued as new prunes exactly what it set out to. Plain data only.
"""

# No `from __future__ import annotations`: Temporal's converter reads real annotations.
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

RETENTION_WORKFLOW_TYPE = "Retention"
RETENTION_PLAN_ACTIVITY = "retention_plan"
PRUNE_PAGE_ACTIVITY = "prune_page"
PRUNE_LANES_PAGE_ACTIVITY = "prune_lanes_page"
# Items pruned per activity, in one transaction (docs/decisions/retention-pages.md).
PRUNE_PAGE_SIZE = 1000

Phase = Literal["payloads", "rows"]


def retention_schedule_id(workflow_task_queue: str) -> str:
    """The retention schedule of the stack on `workflow_task_queue`."""
    return f"retention/{workflow_task_queue}"


def retention_workflow_id(workflow_task_queue: str) -> str:
    """The id each run of that schedule starts (the schedule appends its fire time)."""
    return f"retention/{workflow_task_queue}"


@dataclass
class RetentionRule:
    """Prune ended items of `destination` in `outbox` (None: every outbox but `excluded`)
    whose payload ended `payload_retention_s` ago, and whose row ended `item_retention_s` ago."""

    destination: str
    outbox: str | None
    payload_retention_s: float
    item_retention_s: float
    excluded: list[str] = field(default_factory=list)


@dataclass
class RetentionPlanRequest:
    """Plan from the worker's destinations and outbox settings (nothing to give)."""


@dataclass
class RetentionPlan:
    rules: list[RetentionRule]
    # How long an idle lane's row is kept: the longest item retention of the rules (a lane's
    # row outlives the rows of the items it carried). None in plans from before it.
    lane_retention_s: float | None = None
    # Flow-control counts the plan swept, past the longest quota window (`readmodel.permits`).
    flow_counts_swept: int = 0


@dataclass
class PruneCursor:
    """Where a phase's pages stand: the last item of the page before, by when it ended and its
    id. The next page takes the items after it, an index range each (migration 0022)."""

    finished_at: datetime
    item_id: str


@dataclass
class RetentionProgress:
    """How far a run is: its rules (planned by its first activity), the rule and phase it is
    in, payloads and rows pruned so far; `done` at its end. The workflow's `progress` query."""

    started_at: datetime | None = None
    rules: list[RetentionRule] | None = None
    rule: int = 0
    phase: Phase = "payloads"
    # The phase's last page's last item (None at a phase's start, and in runs from before it).
    after: PruneCursor | None = None
    payloads_pruned: int = 0
    rows_pruned: int = 0
    # The lanes' phase, after the rules: how long idle lanes are kept (None: a run planned
    # before lanes were pruned, which prunes none), where its pages stand, how many went.
    lane_retention_s: float | None = None
    lanes_after: PruneCursor | None = None
    lanes_pruned: int = 0
    lanes_done: bool = False
    flow_counts_swept: int = 0
    pages: int = 0
    done: bool = False
    finished_at: datetime | None = None
    failure: str | None = None


@dataclass
class RetentionInput:
    """Where the pages run, and how far the run got (carried across continue-as-new)."""

    operations_task_queue: str
    progress: RetentionProgress = field(default_factory=RetentionProgress)


@dataclass
class PrunePageRequest:
    rule: RetentionRule
    phase: Phase
    # Items that ended before this are pruned (the run's start minus the rule's retention).
    ended_before: datetime
    limit: int = PRUNE_PAGE_SIZE
    # The page starts after this item (None: from the oldest).
    after: PruneCursor | None = None


@dataclass
class PruneLanesRequest:
    # Lanes idle since before this go (the run's start minus `lane_retention_s`).
    idle_before: datetime
    limit: int = PRUNE_PAGE_SIZE
    # The page starts after this lane (`finished_at`: its row's `updated_at`; None: the oldest).
    after: PruneCursor | None = None


@dataclass
class PrunePageResult:
    pruned: int
    # False once the rule's phase has nothing left before the cutoff.
    more: bool
    # The page's last item: the next page's `after`.
    last: PruneCursor | None = None
