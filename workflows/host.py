"""A workflow that hosts many deliveries: the bulk shard, and the ordering lane of item mode.

The Cloudflare Queues v2 move (docs/explanation/seeds.md): one coordinator per queue became
sharded Durable Objects. Here a bulk destination's items are spread over its shards by a hash of
the item id (of the lane id, for an item with an ordering key), and each shard runs
`workflows.delivery.Delivery` for every item it holds, the very state machine of the item
workflow. An item-mode ordering lane is the same host with one lane (`workflows.lane`). What a
host does differently from an item workflow is what makes it cheap:

- its items share timers: each wait is rounded up to the next `TICK` and one durable timer wakes
  the host for every wait due by then (a wait is never shorter than asked: Retry-After holds);
- their transitions are written by the submit and poll activities, like an item's, and the rest
  in batches: one local activity per batch of items instead of one per transition;
- items arrive in batches (one signal or update per host for a batch enqueue);
- with `submit_batch`/`poll_batch`, submits and polls that fall due together share an activity
  (the destination's queues then count batches: see `durable_outbox_temporal.destinations`);
- no per-item search attributes: the Web UI shows the host and its counts; each item's story is
  in the read model.

Items with an ordering key go to their lane (`workflows.ordering.Lane`), which runs them one at a
time in arrival order beside the unordered items and the other lanes' heads.

It continues as new carrying its items and lanes (each with its state) once Temporal suggests
it: new submits and polls wait, the ones out finish, and the next run resumes every item where
it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

from temporalio import workflow
from temporalio.common import Priority, RawValue, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError
from temporalio.exceptions import TimeoutError as ActivityTimeoutError
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from durable_outbox_temporal.contract import bulk as shard_contract
    from durable_outbox_temporal.contract.bulk import (
        CANCEL_ITEM_SIGNAL,
        ENQUEUE_SIGNAL,
        ITEM_REPORT_SIGNAL,
        RECENT_KEPT,
        SHARD_QUERY,
        CarriedPart,
        ItemCancel,
        ItemReport,
        ShardEnqueue,
        ShardInput,
        ShardView,
    )
    from durable_outbox_temporal.contract.ids import (
        item_workflow_id,
        lane_workflow_id,
        parse_item_workflow_id,
    )
    from durable_outbox_temporal.contract.item import (
        BatchProgress,
        DeliveryPolicy,
        ItemErrorType,
        ItemProjection,
        ItemStatus,
        OutboxItemInput,
        OutboxItemView,
        PollOutcome,
        PollRequest,
        SubmitOutcome,
        SubmitRequest,
    )
    from durable_outbox_temporal.contract.lane import (
        APPEND_SIGNAL,
        APPEND_UPDATE,
        LANE_QUERY,
        REDRIVE_HEAD_SIGNAL,
        REMOVE_UPDATE,
        SKIP_HEAD_SIGNAL,
        AppendOutcome,
        LaneAppends,
        LaneAppendsResult,
        LaneDetail,
        LanePolicy,
        LaneState,
        RedriveHead,
        RemoveRequest,
        RemoveResult,
        SkipHead,
    )
    from durable_outbox_temporal.contract.priority import DEFAULT_PRIORITY, rank

    from activities.delivery import HEARTBEAT_TIMEOUT, DeliveryActivities, went_through
    from activities.projection import ProjectionActivities
    from workflows import carried_text
    from workflows.delivery import (
        AFTER_A_WITHDRAWABLE_ATTEMPT,
        BATCH_RETRIES,
        WITHDRAWABLE_ATTEMPT,
        Delivery,
        DeliveryFailed,
        Withdrawn,
        retried_by_the_workflow,
        rows_may_lead,
    )
    from workflows.ordering import PROJECT_EVERY, Ended, Lane
    from workflows.slow_local_activities import (
        READ_MODEL_WRITES_PATCH,
        SLOW_WRITE_TASKS_MEMO,
        SlowLocalActivities,
    )

# Waits are rounded up to this, so the items waiting in one tick share one timer.
TICK = timedelta(milliseconds=100)
# Submits and polls one shard has out at once. Temporal keeps a workflow's pending activities
# in its mutable state, which the server rewrites at every step of that workflow: a shard with
# thousands out would make every step cost thousands. The rest wait their turn in the shard, for
# free. Why: docs/decisions/bulk-shards.md
MAX_OUT = 100
# Beyond MAX_OUT, room for items more urgent than the default
# (`durable_outbox_temporal/contract/priority.py`).
URGENT_ROOM = 20
# Submit (and, apart, poll) activities of a batching shard out at once; the requests asked for
# meanwhile wait and fill the next batches (see `_Batcher`).
BATCHES_OUT = 4
# Projections one local activity writes at most (item transitions; lanes with theirs).
PROJECTION_BATCH = 200
LANE_PROJECTION_BATCH = 50
_PROJECTION_RETRIES = RetryPolicy(
    initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=30)
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_CARRY_IN_PARTS_PATCH = "shard-carry-in-parts"
# How long a hand-over (continue-as-new) waits for the submits and polls out before it takes
# back what no worker has taken: on a paused queue they would wait for the resume, and the run
# with them (docs/decisions/hand-over-while-paused.md).
HAND_OVER_GRACE = timedelta(seconds=10)
# The patch that has the hand-over take them back, and the host's own polls wait for a cancel's
# outcome so that they can be (runs from before waited for all of them).
_HAND_OVER_WITHDRAWS_PATCH = "hand-over-withdraws-what-waits"
_ENQUEUES_LATER_PATCH = "shard-admits-enqueues-later"
# A delivery report for an item the host no longer holds is recorded in the item's row (runs
# from before dropped it).
_LATE_REPORTS_PATCH = "late-reports-recorded"

Written = TypeVar("Written")


Request = TypeVar("Request", SubmitRequest, PollRequest)
Outcome = TypeVar("Outcome", SubmitOutcome, PollOutcome)


@dataclass(eq=False)
class _OutBatch(Generic[Request, Outcome]):
    """A batch whose activity is out, and the errors its withdrawn requests are answered with
    should the activity be cancelled before any worker took it (by their outcome's id)."""

    entries: list[tuple[Request, DeliveryPolicy, asyncio.Future[Outcome]]]
    priorities: dict[int, int | None]
    handle: workflow.ActivityHandle[list[Outcome]] | None = None
    withdrawn: dict[int, Exception] = field(default_factory=dict)


@dataclass
class _Batcher(Generic[Request, Outcome]):
    """Submits (or polls) asked for by the shard's deliveries, sent in activities of up to
    `size`, at most `BATCHES_OUT` at once.

    Each activity spends one of the queue's tokens however few items it carries, so a lone
    request would cost a whole batch's share of the rate. While `BATCHES_OUT` activities are out
    (waiting for the server to dispatch them, at the queue's rate, or running), new requests
    wait here and go out together when one comes back: the slower the queue, the fuller the
    batches.

    A lane's run of items (one `sequence`) goes in order within a batch, beside other runs and
    other items, with one batch of it out at a time (the activity submits a run's items one
    after another); once one of its items was not delivered, the run's later requests are
    answered `untried` without being sent."""

    activity: Callable[[DeliveryActivities, list[Request]], Awaitable[list[Outcome]]]
    task_queue: Callable[[DeliveryPolicy], str]
    timeout_s: Callable[[DeliveryPolicy], float]
    failed: Callable[[str], Outcome]
    noun: str
    size: int = 1
    sequence_of: Callable[[Request], str | None] = lambda _: None
    went_through: Callable[[Request, Outcome], bool] = lambda _, __: True
    untried: Callable[[], Outcome] | None = None
    # Whether its requests can be withdrawn (`withdraw`): submits, whose batches the server then
    # tries once (`WITHDRAWABLE_ATTEMPT`), and the workflow again should that attempt fail.
    withdrawable: bool = False
    # The outcomes a withdrawable batch's heartbeat details recorded, by request index.
    recorded: Callable[[list[Any], int], dict[int, Outcome]] = lambda _, __: {}
    _asked: list[tuple[Request, DeliveryPolicy, asyncio.Future[Outcome]]] = field(
        default_factory=list
    )
    # Each asked request's priority (`durable_outbox_temporal/contract/priority.py`), by its
    # outcome's future.
    _priorities: dict[int, int | None] = field(default_factory=dict)
    _sequences: dict[str, list[tuple[Request, DeliveryPolicy, asyncio.Future[Outcome]]]] = field(
        default_factory=dict
    )
    _sequences_out: set[str] = field(default_factory=set)
    _stopped: dict[str, None] = field(default_factory=dict)
    _gathering: bool = False
    _out: int = 0
    _out_batches: list[_OutBatch[Request, Outcome]] = field(default_factory=list)

    def withdraw(self, request: Request, error: Exception) -> bool:
        """Take back a request no worker has sent (its item was cancelled): one still waiting
        here is answered `error` at once; one whose batch's activity waits on the server has
        that activity cancelled, and if no worker had taken it, `error` answers it and the
        batch's other requests are asked again. False: not a request this batcher can take back
        (a lane run's, or one already answered)."""
        if self.sequence_of(request) is not None:
            return False
        for index, (asked, _, outcome) in enumerate(self._asked):
            if asked is request:
                del self._asked[index]
                self._priorities.pop(id(outcome), None)
                outcome.set_exception(error)
                return True
        for out in self._out_batches:
            for asked, _, outcome in out.entries:
                if asked is request and out.handle is not None:
                    if not out.withdrawn:
                        out.handle.cancel()
                    out.withdrawn[id(outcome)] = error
                    return True
        return False

    def withdraw_all(self) -> None:
        """Take back every request no worker has sent (the host hands over): those waiting here
        are answered `Withdrawn` at once, lanes' runs included; each batch out has its activity
        cancelled, and one no worker had taken answers all its requests `Withdrawn`
        (`_ask_again`), while one a worker runs finishes and its outcomes stand."""
        waiting = [*self._asked, *(entry for run in self._sequences.values() for entry in run)]
        self._asked.clear()
        self._sequences.clear()
        for _, _, waits in waiting:
            self._priorities.pop(id(waits), None)
            waits.set_exception(Withdrawn())
        for out in self._out_batches:
            if out.handle is None:
                continue
            if not out.withdrawn:
                out.handle.cancel()
            for _, _, answer in out.entries:
                out.withdrawn.setdefault(id(answer), Withdrawn())

    async def ask(
        self, request: Request, policy: DeliveryPolicy, priority: int | None = None
    ) -> Outcome:
        outcome: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        if priority is not None:
            self._priorities[id(outcome)] = priority
        sequence = self.sequence_of(request)
        if sequence is None:
            self._asked.append((request, policy, outcome))
        else:
            self._sequences.setdefault(sequence, []).append((request, policy, outcome))
        self._send_soon()
        return await outcome

    def _send_soon(self) -> None:
        if not self._gathering:
            # Sent after every delivery already woken in this step has asked (they run first),
            # so the requests that fell due together go out together.
            self._gathering = True
            asyncio.create_task(self._send())

    async def _send(self) -> None:
        self._gathering = False
        while self._out < BATCHES_OUT:
            batch = self._next_batch()
            if not batch:
                return
            self._out += 1
            asyncio.create_task(self._send_batch(batch))

    def _next_batch(self) -> list[tuple[Request, DeliveryPolicy, asyncio.Future[Outcome]]]:
        """Up to `size` requests: the runs whose earlier batch is answered (each in order), then
        the others in the order they were asked."""
        batch: list[tuple[Request, DeliveryPolicy, asyncio.Future[Outcome]]] = []
        for sequence in list(self._sequences):
            if sequence in self._sequences_out:
                continue  # the next batch of a run goes once the one before is answered
            if sequence in self._stopped:
                assert self.untried is not None
                for _, _, outcome in self._sequences.pop(sequence):
                    outcome.set_result(self.untried())
                continue
            room = self.size - len(batch)
            if room <= 0:
                break
            queued = self._sequences.pop(sequence)
            if queued[room:]:
                self._sequences[sequence] = queued[room:]
            batch += queued[:room]
            self._sequences_out.add(sequence)
        room = self.size - len(batch)
        if self._priorities:
            # Lowest priority number first; asked order within one priority (a stable sort).
            self._asked.sort(key=lambda asked: rank(self._priorities.get(id(asked[2]))))
        batch += self._asked[:room]
        del self._asked[:room]
        return batch

    def _batch_priority(
        self, batch: list[tuple[Request, DeliveryPolicy, asyncio.Future[Outcome]]]
    ) -> Priority:
        """The most urgent priority in the batch, for the server's queue (the default, what a
        batch had before priorities, when none is set)."""
        found = [self._priorities.pop(id(outcome), None) for _, _, outcome in batch]
        chosen = [priority for priority in found if priority is not None]
        return Priority(priority_key=min(chosen)) if chosen else Priority.default

    async def _send_batch(
        self, batch: list[tuple[Request, DeliveryPolicy, asyncio.Future[Outcome]]]
    ) -> None:
        policy = batch[0][1]
        sequences = [self.sequence_of(request) for request, _, _ in batch]
        out = _OutBatch(batch, {id(o): self._priorities.get(id(o)) for _, _, o in batch})
        priority = self._batch_priority(batch)

        def start(
            requests: list[Request], retries: RetryPolicy, summary: str
        ) -> workflow.ActivityHandle[list[Outcome]]:
            return workflow.start_activity_method(
                self.activity,
                requests,
                task_queue=self.task_queue(policy),
                start_to_close_timeout=timedelta(seconds=self.timeout_s(policy)),
                heartbeat_timeout=HEARTBEAT_TIMEOUT,
                retry_policy=retries,
                summary=summary,
                priority=priority,
                # Only a withdrawal cancels it (`withdraw`): one a worker runs then finishes,
                # and its outcomes stand, so a cancel never leaves a submit's fate unknown.
                cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            )

        requests = [request for request, _, _ in batch]
        summary = f"{self.noun} {len(batch)} items"
        try:
            out.handle = start(
                requests, WITHDRAWABLE_ATTEMPT if self.withdrawable else BATCH_RETRIES, summary
            )
            self._out_batches.append(out)
            try:
                outcomes = await out.handle
            except ActivityError as err:
                if not (self.withdrawable and retried_by_the_workflow(err)):
                    raise
                # Its attempt may have sent some of it: from here it is never withdrawn.
                self._out_batches.remove(out)
                outcomes = await self._try_again(
                    requests,
                    _last_heartbeat_details(err),
                    lambda rest: start(rest, AFTER_A_WITHDRAWABLE_ATTEMPT, f"{summary}, again"),
                )
        except ActivityError as err:
            # Withdrawn before any worker took it (`withdraw`): no request of it went.
            withdrawn = isinstance(err.cause, CancelledError) and not err.started_event_id
            outcomes = self._all_failed(requests, err)
        else:
            withdrawn = False
        finally:
            self._out -= 1
            if out in self._out_batches:
                self._out_batches.remove(out)
        if withdrawn and out.withdrawn:
            self._ask_again(out)
            return
        for (request, _, _), sequence, answered in zip(batch, sequences, outcomes, strict=True):
            if sequence is None:
                continue
            self._sequences_out.discard(sequence)
            if not self.went_through(request, answered):
                self._stopped[sequence] = None
        while len(self._stopped) > RECENT_KEPT:
            del self._stopped[next(iter(self._stopped))]
        for (_, _, outcome), answered in zip(batch, outcomes, strict=True):
            outcome.set_result(answered)
        if self._asked or self._sequences:
            self._send_soon()

    async def _try_again(
        self,
        requests: list[Request],
        details: list[Any],
        start: Callable[[list[Request]], Awaitable[list[Outcome]]],
    ) -> list[Outcome]:
        """A withdrawable batch whose one attempt failed unclassified: the outcomes its last
        heartbeat recorded stand (`BatchProgress`), and the rest goes in a new activity, a run's
        requests after one that did not go through answered `untried` as the activity would."""
        recorded = self.recorded(details, len(requests))
        answered: list[Outcome | None] = [recorded.get(i) for i in range(len(requests))]
        stopped: set[str] = set()
        rest: list[int] = []
        for index, request in enumerate(requests):
            sequence = self.sequence_of(request)
            outcome = answered[index]
            if outcome is not None:
                if sequence is not None and not self.went_through(request, outcome):
                    stopped.add(sequence)
            elif sequence is not None and sequence in stopped:
                answered[index] = self._untried()
            else:
                rest.append(index)
        if rest:
            again = [requests[index] for index in rest]
            for request in again:
                rows_may_lead(request)
            try:
                sent = await start(again)
            except ActivityError as err:
                # What the first attempt recorded still stands.
                sent = self._all_failed(again, err)
            for index, outcome in zip(rest, sent, strict=True):
                answered[index] = outcome
        outcomes = [outcome for outcome in answered if outcome is not None]
        assert len(outcomes) == len(requests), "each request answered"
        return outcomes

    def _all_failed(self, requests: list[Request], err: ActivityError) -> list[Outcome]:
        """The outcomes of an activity that failed as a whole (after its retries): each item
        counts a failed request; in a run, only its first (the rest are sent again, under their
        own idempotency keys, when their turn comes again)."""
        failed = self.failed(str(err.cause or err))
        sequences = [self.sequence_of(request) for request in requests]
        return [
            failed if sequence is None or sequences.index(sequence) == index else self._untried()
            for index, sequence in enumerate(sequences)
        ]

    def _untried(self) -> Outcome:
        assert self.untried is not None
        return self.untried()

    def _ask_again(self, out: _OutBatch[Request, Outcome]) -> None:
        """A withdrawn batch that never went: its withdrawn requests are answered with their
        errors, the others wait again ahead of those asked since, each run in its order."""
        again: list[tuple[Request, DeliveryPolicy, asyncio.Future[Outcome]]] = []
        runs: dict[str, list[tuple[Request, DeliveryPolicy, asyncio.Future[Outcome]]]] = {}
        for entry in out.entries:
            request, _, outcome = entry
            error = out.withdrawn.get(id(outcome))
            sequence = self.sequence_of(request)
            if error is not None:
                outcome.set_exception(error)
                if sequence is not None:
                    self._sequences_out.discard(sequence)
            elif sequence is None:
                again.append(entry)
                if out.priorities.get(id(outcome)) is not None:
                    self._priorities[id(outcome)] = out.priorities[id(outcome)]
            else:
                runs.setdefault(sequence, []).append(entry)
        self._asked[:0] = again
        for sequence, entries in runs.items():
            self._sequences_out.discard(sequence)
            self._sequences[sequence] = entries + self._sequences.get(sequence, [])
        if self._asked or self._sequences:
            self._send_soon()


class DeliveryHostWorkflow:
    """Holds many items (unordered, and in ordering lanes) and delivers each with the shared
    machine. Not a workflow itself: `BulkShardWorkflow` and `OutboxLaneWorkflow` are."""

    @workflow.init
    def __init__(self, start: ShardInput) -> None:
        self._start = start
        # Unordered items, and sent lane items staying open for their delivery reports.
        self._deliveries: dict[str, Delivery] = {}
        self._running: dict[str, asyncio.Task[None]] = {}
        # Ordering lanes by lane id; the item ids they hold, to route a cancel or a report.
        self._lanes: dict[str, Lane] = {}
        self._lane_tasks: dict[str, asyncio.Task[None]] = {}
        self._lane_of_item: dict[str, Lane] = {}
        # Ids of the items finished lately, oldest first (a dict: ordered, and a cheap lookup
        # for each of thousands of enqueues arriving in one workflow task).
        self._recent: dict[str, None] = dict.fromkeys(start.recent[-RECENT_KEPT:])
        self._finished = 0
        # Batched projections, each with the future its delivery waits on.
        self._to_project: list[tuple[ItemProjection, asyncio.Future[None]]] = []
        self._flushing = False
        # Delivery reports for items no longer held, waiting to be recorded in their rows.
        self._late_reports: list[ItemReport] = []
        self._late_recording = False
        # Lanes whose view changed since it was last projected.
        self._lanes_changed: dict[str, Lane] = {}
        self._lanes_flushing = False
        self._lanes_flush_later = False
        # Writes to the read model (local activities), marking the tasks that run while one is
        # slow.
        self._writes = SlowLocalActivities(READ_MODEL_WRITES_PATCH, SLOW_WRITE_TASKS_MEMO)
        # The shared timer: when it is set to fire, and whether a wait wants it earlier.
        self._timer_at: datetime | None = None
        self._wake_ats: list[datetime] = []
        self._rearm = False
        self._draining = False
        # Submits and polls out (at most MAX_OUT), and the deliveries waiting for a turn.
        self._out = 0
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._turns = 0
        # Submits and polls asked for in this step and not yet sent.
        self._submits: _Batcher[SubmitRequest, SubmitOutcome] = _Batcher(
            DeliveryActivities.submit_items,
            lambda policy: policy.submit_task_queue,
            lambda policy: policy.submit_timeout_s,
            lambda message: SubmitOutcome(error_type=ItemErrorType.TRANSIENT, message=message),
            "submit",
            start.submit_batch,
            sequence_of=lambda request: request.sequence,
            went_through=went_through,
            untried=lambda: SubmitOutcome(not_attempted=True),
            withdrawable=True,
            recorded=lambda details, count: BatchProgress.read(
                details, count, workflow.payload_converter()
            ),
        )
        self._polls: _Batcher[PollRequest, PollOutcome] = _Batcher(
            DeliveryActivities.poll_operations,
            lambda policy: policy.poll_task_queue,
            lambda policy: policy.poll_timeout_s,
            lambda message: PollOutcome(error_type=ItemErrorType.TRANSIENT, message=message),
            "poll",
            start.poll_batch,
        )
        # Item mode: each destination's `lane_run`, as the latest append said (`run_length`).
        self._lane_runs = dict(start.lane_runs)
        # Before any handler runs: an append in the first task finds its carried lane.
        for lane_state in start.lanes:
            self._add_lane(lane_state)
        # What waits to be admitted, in order: carried parts (their JSON text) and enqueues
        # past what one workflow task admits (as they came); appends, redrives, skips and
        # removals wait for them (`_all_admitted`), a cancel or a report for an item not held
        # for that item (`_admitted`). Items admitted in the current task, and which task.
        self._later: list[str | RawValue] = list(start.later)
        # What this run admits a task is what its input names: a release that changes
        # `ADMIT_PER_TASK` replays the runs before it by theirs. At least one, or nothing
        # waiting would ever be admitted.
        self._per_task = max(
            1,
            shard_contract.ADMIT_PER_TASK_UNNAMED
            if start.admit_per_task is None
            else start.admit_per_task,
        )
        self._admitted_now = _held_count(start.items, start.lanes)
        self._admitted_at = workflow.info().get_current_history_length()

    async def _run(self) -> None:
        """Deliver until nothing has been held for `linger_s`, continuing as new on the way."""
        for lane in self._lanes.values():
            self._start_lane(lane)
        for item in self._start.items:
            self._admit(item)
        if self._later:
            # Its marker in this run too: a worker from before the parts, which would read the
            # input without them, fails this run's replay rather than drop them.
            workflow.patched(_CARRY_IN_PARTS_PATCH)
        asyncio.create_task(self._admit_later())
        try:
            await self._serve()
        except asyncio.CancelledError:
            # Cancelled itself (Web UI, CLI): the items waiting in lanes will never run, so each
            # is recorded as cancelled rather than silently dropped. (Evicted from the worker's
            # cache instead: nothing may be recorded, see `Delivery.run`.)
            if workflow.cancellation_reason() is None:
                raise
            # The lanes of what waits to be admitted are recorded too (in this one task: a
            # cancel is rare, and nothing of them runs).
            for work in self._later:
                if isinstance(work, str):
                    for lane_state in _read_part(work).lanes:
                        self._add_lane(lane_state)
                    continue
                batch = _read_enqueue(work)
                for item in batch.items:
                    if item.ordering_key is not None and item.state is None:
                        item_id = item_workflow_id(item.outbox, item.key)
                        policy = batch.lane_policies.get(item.outbox)
                        self._append(item_id, item, policy, capped=False, start=False)
            self._later.clear()
            for lane in self._lanes.values():
                lane.remove_all("cancelled with its host workflow")
            self._project_lanes()
            await workflow.wait_condition(self._all_projected)
            raise

    async def _admit_later(self) -> None:
        """Admit what waits, about the run's `admit_per_task` items a workflow task (a 1 ms
        timer ends the task before), so that no task reads or admits more however many the
        shard carried or is sent at once. Runs for the run's life; with nothing waiting it
        issues nothing."""
        while True:
            await workflow.wait_condition(lambda: bool(self._later))
            await workflow.sleep(timedelta(milliseconds=1), summary="admit carried items")
            while self._later and self._room() > 0:
                work = self._later.pop(0)
                if isinstance(work, str):
                    part = _read_part(work)
                    for lane_state in part.lanes:
                        self._start_lane(self._add_lane(lane_state))
                    for item in part.items:
                        self._admit(item)
                    self._admitted_now += _held_count(part.items, part.lanes)
                else:
                    self._enqueue(_read_enqueue(work))

    def _room(self) -> int:
        """Items the current workflow task may still admit (each task's history length
        differs from the one before's)."""
        length = workflow.info().get_current_history_length()
        if length != self._admitted_at:
            self._admitted_at, self._admitted_now = length, 0
        return self._per_task - self._admitted_now

    async def _all_admitted(self) -> None:
        """An append, a redrive, a skip or a removal first waits here for what waits to be
        admitted: it must find the lanes and items carried or enqueued before it, as they
        were, not miss them or start them afresh. With nothing waiting (always, for a run
        carried in one piece and never sent more than a task admits) it returns at once,
        without yielding: the handler runs as it did before."""
        if self._later:
            await workflow.wait_condition(lambda: not self._later)

    async def _admitted(self, item_id: str) -> None:
        """A cancel or a report for an item not held waits until it is, or until nothing waits
        to be admitted (then it is not here): not for everything waiting, or the item's submit
        could go meanwhile and the cancel lose."""
        if self._later:
            await workflow.wait_condition(lambda: self._holds(item_id) or not self._later)

    def _holds(self, item_id: str) -> bool:
        return self._delivery(item_id) is not None or item_id in self._lane_of_item

    async def _serve(self) -> None:
        linger = timedelta(seconds=self._start.linger_s)
        while True:
            self._show_details()
            if self._should_continue_as_new():
                await self._continue_as_new()
            if not self._busy():
                # Empty: write what the lanes' rows lack (nothing is in flight to delay), linger
                # for more items, then end (the next enqueue starts it again).
                self._project_lanes()
                try:
                    await workflow.wait_condition(
                        self._busy, timeout=linger, timeout_summary="linger"
                    )
                except TimeoutError:
                    self._project_lanes()
                    await workflow.wait_condition(self._all_projected)
                    if not self._busy() and workflow.all_handlers_finished():
                        return
                continue
            self._rearm = False
            due = self._next_wake_at()
            timeout = None if due is None else max(due - workflow.now(), timedelta(0))
            try:
                await workflow.wait_condition(
                    lambda: self._rearm or not self._busy() or self._should_continue_as_new(),
                    timeout=timeout,
                    timeout_summary="next wake-up",
                )
            except TimeoutError:
                self._timer_at = None

    def _busy(self) -> bool:
        return (
            bool(self._deliveries)
            or bool(self._later)
            or any(lane.state.entries for lane in self._lanes.values())
        )

    # -- handlers --------------------------------------------------------------------------------

    @workflow.signal(name=ENQUEUE_SIGNAL)
    async def enqueue_items(self, raw: RawValue) -> None:
        """A `ShardEnqueue`, read here rather than by the SDK: a burst of enqueues reaches the
        shard in one workflow task (the server hands it every signal that came meanwhile), and
        those past the run's `admit_per_task` items wait, unread, for later tasks, in order."""
        if (self._later or self._room() <= 0) and workflow.patched(_ENQUEUES_LATER_PATCH):
            self._later.append(raw)
            return
        self._enqueue(_read_enqueue(raw))

    def _enqueue(self, batch: ShardEnqueue) -> None:
        self._admitted_now += len(batch.items)
        # The destination's batch sizes as configured now: a changed config applies from the
        # next enqueue, like the worker's queue rates from its next start.
        if batch.submit_batch is not None:
            self._submits.size = batch.submit_batch
        if batch.poll_batch is not None:
            self._polls.size = batch.poll_batch
        for item in batch.items:
            self._admit(item, batch.lane_policies.get(item.outbox))

    @workflow.update(name=APPEND_UPDATE)
    async def append_items(self, appends: LaneAppends) -> LaneAppendsResult:
        """Append items to their lanes, in order; what became of each."""
        await self._all_admitted()
        self._lane_runs.update(appends.lane_runs)
        return LaneAppendsResult(
            outcomes=[self._admit(item, appends.policy, capped=True) for item in appends.items]
        )

    @workflow.signal(name=APPEND_SIGNAL)
    async def append_items_unconfirmed(self, appends: LaneAppends) -> None:
        """The same append, sent when no worker answered the update in time."""
        await self._all_admitted()
        self._lane_runs.update(appends.lane_runs)
        for item in appends.items:
            self._admit(item, appends.policy)

    @workflow.signal(name=CANCEL_ITEM_SIGNAL)
    async def cancel_item(self, cancel: ItemCancel) -> None:
        if not self._holds(cancel.item_id):
            # Not held (yet): perhaps in what waits to be admitted.
            await self._admitted(cancel.item_id)
        delivery = self._delivery(cancel.item_id)
        if delivery is not None:
            delivery.request_cancel(cancel.request)
            return
        lane = self._lane_of_item.get(cancel.item_id)
        if lane is not None:
            _, key = parse_item_workflow_id(cancel.item_id)
            if lane.remove_waiting(key, cancel.request.reason):
                del self._lane_of_item[cancel.item_id]

    @workflow.signal(name=ITEM_REPORT_SIGNAL)
    async def item_delivery_report(self, routed: ItemReport) -> None:
        if self._delivery(routed.item_id) is None:
            await self._admitted(routed.item_id)
        delivery = self._delivery(routed.item_id)
        if delivery is not None:
            await delivery.delivery_report(routed.report)
        elif workflow.patched(_LATE_REPORTS_PATCH):
            # Its report window is over (or it was never here): the signal reached a running
            # host all the same, so no caller learns it is late. Its read-model row takes it.
            await self._record_late(routed)

    async def _record_late(self, routed: ItemReport) -> None:
        """Record reports on items no longer held, a batch per local activity; the handler that
        started the batches waits until none are left (a continue-as-new waits for it)."""
        self._late_reports.append(routed)
        if self._late_recording:
            return
        self._late_recording = True
        try:
            while self._late_reports:
                batch = self._late_reports[:PROJECTION_BATCH]
                del self._late_reports[:PROJECTION_BATCH]
                await self._write_read_model(
                    ProjectionActivities.record_late_reports,
                    batch,
                    f"record {len(batch)} late delivery reports in the read model",
                )
        finally:
            self._late_recording = False

    @workflow.signal(name=REDRIVE_HEAD_SIGNAL)
    async def redrive_head(self, request: RedriveHead) -> None:
        """Run a halted lane's failed head item again; only while halted on that key."""
        await self._all_admitted()
        for lane in self._lanes_named(request.ordering_key):
            if lane.redrive(request):
                return

    @workflow.signal(name=SKIP_HEAD_SIGNAL)
    async def skip_head(self, request: SkipHead) -> None:
        """Move a halted lane past its failed head item; only while halted on that key."""
        await self._all_admitted()
        for lane in self._lanes_named(request.ordering_key):
            if lane.skip(request):
                return

    @workflow.update(name=REMOVE_UPDATE)
    async def remove(self, request: RemoveRequest) -> RemoveResult:
        """Cancel waiting items of the lanes named (or all lanes); once projected."""
        await self._all_admitted()
        result = RemoveResult()
        for lane in list(self._lanes.values()):
            if request.outbox is not None and lane.state.outbox != request.outbox:
                continue
            if request.ordering_key is not None and lane.state.ordering_key != request.ordering_key:
                continue
            taken = await lane.remove(request)
            result.removed += taken.removed
            result.views += taken.views
            result.head = result.head or taken.head
            for view in taken.views:
                self._lane_of_item.pop(view.id, None)
        return result

    @workflow.query(name=LANE_QUERY)
    def lane(self, lane_id: str) -> LaneDetail:
        """A lane's view and the first keys behind its head; fails for a lane not held here."""
        lane = self._lanes.get(lane_id)
        if lane is None:
            raise ApplicationError(f"no lane {lane_id!r} here", type="LaneNotHeld")
        return lane.detail()

    @workflow.query(name=SHARD_QUERY)
    def view(self) -> ShardView:
        by_status: dict[str, int] = {}
        for delivery in self._deliveries.values():
            status = delivery.state.status.value
            by_status[status] = by_status.get(status, 0) + 1
        return ShardView(
            destination=self._start.destination,
            shard=self._start.shard,
            held=len(self._deliveries),
            by_status=by_status,
            finished=self._finished,
            lanes=len(self._lanes),
            in_lanes=sum(len(lane.state.entries) for lane in self._lanes.values()),
        )

    # -- items -----------------------------------------------------------------------------------

    def _admit(
        self, item: OutboxItemInput, lane_policy: LanePolicy | None = None, *, capped: bool = False
    ) -> AppendOutcome:
        item_id = item_workflow_id(item.outbox, item.key)
        if item_id in self._deliveries or _generation_id(item) in self._recent:
            return AppendOutcome.DUPLICATE  # a repeated enqueue (a client's retry)
        # Carried as an unordered item: a lane's item that was sent, or accepted and let go.
        resumed = item.state is not None and item.state.status is not ItemStatus.QUEUED
        if item.ordering_key is not None and not resumed:
            return self._append(item_id, item, lane_policy, capped)
        delivery = Delivery(item_id, item, self, sharing=self)
        self._deliveries[item_id] = delivery
        self._running[item_id] = asyncio.create_task(self._deliver(delivery))
        return AppendOutcome.QUEUED

    def _append(
        self,
        item_id: str,
        item: OutboxItemInput,
        lane_policy: LanePolicy | None,
        capped: bool,
        *,
        start: bool = True,
    ) -> AppendOutcome:
        assert item.ordering_key is not None
        lane_id = lane_workflow_id(item.outbox, item.ordering_key)
        lane = self._lanes.get(lane_id)
        if lane is None:
            lane = self._add_lane(
                LaneState(
                    outbox=item.outbox,
                    ordering_key=item.ordering_key,
                    policy=lane_policy or LanePolicy.HALT,
                    destination=self._start.destination or None,
                )
            )
        if lane_policy is not None:
            lane.state.policy = lane_policy
        outcome = lane.admit(item, capped=capped)
        if outcome is AppendOutcome.QUEUED:
            self._lane_of_item[item_id] = lane
            if start:
                self._start_lane(lane)
        return outcome

    def _add_lane(self, state: LaneState) -> Lane:
        lane = Lane(state, self)
        self._lanes[lane.id] = lane
        for entry in state.entries:
            self._lane_of_item[item_workflow_id(state.outbox, entry.key)] = lane
        return lane

    def _start_lane(self, lane: Lane) -> None:
        if lane.state.entries and lane.id not in self._lane_tasks:
            self._lane_tasks[lane.id] = asyncio.create_task(self._run_lane(lane))

    async def _run_lane(self, lane: Lane) -> None:
        await lane.run()
        del self._lane_tasks[lane.id]

    def _drop_if_done(self, lane: Lane) -> None:
        """A shard holds many lanes: an empty one goes once its last view is written (a new
        item starts it again, its row moving on from there)."""
        if (
            self._start.destination
            and not lane.state.entries
            and lane.id not in self._lane_tasks
            and not lane.unprojected()
            and self._lanes.get(lane.id) is lane
        ):
            del self._lanes[lane.id]

    def _lanes_named(self, ordering_key: str | None) -> list[Lane]:
        return [
            lane
            for lane in self._lanes.values()
            if ordering_key is None or lane.state.ordering_key == ordering_key
        ]

    def _delivery(self, item_id: str) -> Delivery | None:
        """The running delivery of an item: unordered, listening, or a lane's head."""
        delivery = self._deliveries.get(item_id)
        if delivery is not None:
            return delivery
        lane = self._lane_of_item.get(item_id)
        if lane is not None and lane.head is not None and lane.head.item_id == item_id:
            return lane.head
        return None

    async def _deliver(self, delivery: Delivery) -> None:
        item = delivery.item
        if not delivery.state.started and item.not_before is not None:
            remaining = item.not_before - workflow.now()
            if remaining > timedelta(0):
                await self.wait(remaining, "not before", lambda: delivery.state.cancel_requested)
        # A failure is recorded and projected: the read model holds it as a dead letter.
        with contextlib.suppress(DeliveryFailed):
            await delivery.run()
        self._done(delivery)

    def _done(self, delivery: Delivery) -> None:
        del self._deliveries[delivery.item_id]
        del self._running[delivery.item_id]
        self._recent[_generation_id(delivery.item)] = None
        if len(self._recent) > RECENT_KEPT:
            del self._recent[next(iter(self._recent))]
        self._finished += 1

    # -- LaneHost --------------------------------------------------------------------------------

    def run_length(self, destination: str) -> int:
        """How many of a lane's items may go in one submit activity, one after another: a
        shard's `submit_batch`, whatever the destination (a shard holds one)."""
        return self._submits.size

    def lane_changed(self, lane: Lane) -> None:
        self._lanes_changed[lane.id] = lane
        # While continuing as new, every change is written before the hand-over.
        if lane.projection_due() or self._draining:
            self._project_lanes()
        elif not self._lanes_flush_later:
            # Written within `PROJECT_EVERY` even if nothing else happens (a head in a long
            # wait, appends arriving): one shared timer, not one per change.
            self._lanes_flush_later = True
            asyncio.create_task(self._project_lanes_later())

    async def _project_lanes_later(self) -> None:
        try:
            await self.wait(PROJECT_EVERY, "write the lanes' rows", lambda: not self._lanes_changed)
        finally:
            self._lanes_flush_later = False
        self._project_lanes()

    def _project_lanes(self) -> None:
        """Write every changed lane now (a lane's row trails it otherwise: see `Lane`)."""
        if self._lanes_changed and not self._lanes_flushing:
            self._lanes_flushing = True
            asyncio.create_task(self._flush_lanes())

    def keep_listening(self, delivery: Delivery) -> None:
        """A lane's sent head: open for its reports as an unordered item, carried as one."""
        self._lane_of_item.pop(delivery.item_id, None)
        self._deliveries[delivery.item_id] = delivery
        self._running[delivery.item_id] = asyncio.create_task(self._listen(delivery))

    async def _listen(self, delivery: Delivery) -> None:
        await delivery.listen()
        self._done(delivery)

    def keep_polling(self, delivery: Delivery, ended: asyncio.Task[Ended]) -> None:
        """A lane's accepted head (`order = "submit"`): polled to its end as an unordered item,
        carried as one."""
        self._lane_of_item.pop(delivery.item_id, None)
        self._deliveries[delivery.item_id] = delivery
        self._running[delivery.item_id] = asyncio.create_task(self._see_through(delivery, ended))

    async def _see_through(self, delivery: Delivery, ended: asyncio.Task[Ended]) -> None:
        outcome = await ended
        if isinstance(outcome, OutboxItemView) and outcome.status is ItemStatus.SENT:
            await delivery.listen()
        self._done(delivery)

    async def _flush_lanes(self) -> None:
        """Write the changed lanes' views and their waiting items' transitions, in batches."""
        try:
            while self._lanes_changed:
                batch = list(self._lanes_changed.values())[:LANE_PROJECTION_BATCH]
                for lane in batch:
                    del self._lanes_changed[lane.id]
                taken = [lane.take_projection(PROJECTION_BATCH) for lane in batch]
                await self._write_read_model(
                    ProjectionActivities.project_lanes,
                    taken,
                    f"project {len(batch)} lanes to read model",
                )
                for lane, projection in zip(batch, taken, strict=True):
                    lane.projected(projection.lane.version, projection.lane.status)
                    if lane.items_pending():
                        self._lanes_changed[lane.id] = lane
                    self._drop_if_done(lane)
                self._lanes_projected()
        finally:
            self._lanes_flushing = False

    def _lanes_projected(self) -> None:
        """A hook for a host that shows its lane (the item-mode lane's search attribute)."""

    def _all_projected(self) -> bool:
        return (
            not self._flushing
            and not self._to_project
            and not self._lanes_flushing
            and not self._lanes_changed
        )

    async def _write_read_model(
        self,
        write: Callable[[ProjectionActivities, Written], Awaitable[Any]],
        rows: Written,
        summary: str,
    ) -> None:
        """A write to the read model in a local activity, tried again until it goes through;
        each workflow task that runs while it is out after the one it began in (a slow read
        model) upserts `tasks_while_read_model_slow` (`workflows/slow_local_activities.py`): a
        wait joining the shared timer, or a cap's hold, is reckoned from `now()` there."""
        await self._writes.run(
            workflow.execute_local_activity_method(
                write,
                rows,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=_PROJECTION_RETRIES,
                summary=summary,
            )
        )

    # -- DeliveryHost ----------------------------------------------------------------------------

    async def project(self, projection: ItemProjection) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._to_project.append((projection, done))
        if not self._flushing:
            self._flushing = True
            asyncio.create_task(self._flush())
        await done

    async def _flush(self) -> None:
        """Write the gathered projections, a batch per local activity, until none are left."""
        try:
            while self._to_project:
                batch = self._to_project[:PROJECTION_BATCH]
                del self._to_project[:PROJECTION_BATCH]
                await self._write_read_model(
                    ProjectionActivities.project_items,
                    [projection for projection, _ in batch],
                    f"project {len(batch)} items to read model",
                )
                for _, done in batch:
                    done.set_result(None)
        finally:
            self._flushing = False

    def status_changed(self, status: ItemStatus) -> None:
        """No search attribute per item: the host's counts are in its current details."""

    def show_details(self, lines: list[str]) -> None:
        """One item's details would be lost among many: the host shows its counts instead."""

    async def wait(
        self, duration: timedelta, summary: str, until: Callable[[], bool] | None
    ) -> None:
        at = workflow.now() + duration
        tick = _tick_after(at)
        self._wake_ats.append(tick)
        if self._timer_at is None or tick < self._timer_at:
            self._rearm = True
        await workflow.wait_condition(
            lambda: workflow.now() >= at or (until is not None and until())
        )

    def gate(self, priority: int | None = None) -> Awaitable[None] | None:
        if self._draining:
            # Held until the run continues as new (which resumes it from its state).
            return workflow.wait_condition(lambda: False)
        # An urgent item need not wait for a slot the backlog holds: a few more may be out.
        limit = MAX_OUT + (URGENT_ROOM if rank(priority) < DEFAULT_PRIORITY else 0)
        if self._out < limit:
            self._out += 1
            return None
        # Lowest priority number first, then first come, first served: each answered submit or
        # poll wakes the one that has waited longest among the most urgent.
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._turns += 1
        heapq.heappush(self._waiting, (rank(priority), self._turns, turn))
        return turn

    def release(self) -> None:
        self._out -= 1
        while self._waiting:
            _, _, turn = heapq.heappop(self._waiting)
            if not turn.done():
                turn.set_result(None)
                break

    async def checkpoint(self, delivery: Delivery) -> None:
        """The host continues as new as a whole (see the module docstring)."""

    # -- SharedActivityHost ----------------------------------------------------------------------

    def submit_batched(self) -> bool:
        return self._submits.size > 1

    def withdraws_to_hand_over(self) -> bool:
        return workflow.patched(_HAND_OVER_WITHDRAWS_PATCH)

    def withdraw_submit(self, request: SubmitRequest, error: Exception) -> bool:
        return self._submits.withdraw(request, error)

    async def submit(
        self, request: SubmitRequest, policy: DeliveryPolicy, priority: int | None = None
    ) -> SubmitOutcome:
        """Join the submits asked for in this step; one activity per `submit_batch` of them."""
        return await self._submits.ask(request, policy, priority)

    def poll_batched(self) -> bool:
        return self._polls.size > 1

    async def poll(
        self, request: PollRequest, policy: DeliveryPolicy, priority: int | None = None
    ) -> PollOutcome:
        """Join the polls asked for in this step; one activity per `poll_batch` of them."""
        return await self._polls.ask(request, policy, priority)

    # -- the shared timer and continue-as-new ----------------------------------------------------

    def _next_wake_at(self) -> datetime | None:
        now = workflow.now()
        self._wake_ats = [at for at in self._wake_ats if at > now]
        self._timer_at = min(self._wake_ats, default=None)
        return self._timer_at

    def _should_continue_as_new(self) -> bool:
        # What waits to be admitted goes in first (a few milliseconds a thousand items).
        if not self._busy() or self._later:
            return False
        info = workflow.info()
        limit = self._start.continue_after_events
        return info.is_continue_as_new_suggested() or (
            limit is not None and info.get_current_history_length() >= limit
        )

    def _deliveries_out(self) -> bool:
        running = (delivery for lane in self._lanes.values() for delivery in lane.running)
        return any(d.activity_out for d in (*self._deliveries.values(), *running))

    def _withdraw_to_hand_over(self) -> None:
        """Take back every submit and poll out that no worker has taken (see `HAND_OVER_GRACE`):
        each such item is carried as it was before it, its attempt not spent."""
        self._submits.withdraw_all()
        self._polls.withdraw_all()
        running = (delivery for lane in self._lanes.values() for delivery in lane.running)
        for delivery in (*self._deliveries.values(), *running):
            delivery.withdraw_to_hand_over()

    async def _continue_as_new(self) -> None:
        self._draining = True
        self._project_lanes()
        if self._deliveries_out() and self.withdraws_to_hand_over():
            try:
                await workflow.wait_condition(
                    lambda: not self._deliveries_out(),
                    timeout=HAND_OVER_GRACE,
                    timeout_summary="hand-over: submits and polls out",
                )
            except TimeoutError:
                self._withdraw_to_hand_over()
        # Submits and polls out finish (new ones wait at the gate), projections are written,
        # and enqueues deferred meanwhile are admitted: what is carried is only what is held.
        await workflow.wait_condition(
            lambda: (
                self._all_projected()
                and not self._deliveries_out()
                and workflow.all_handlers_finished()
                and not self._later
            )
        )
        items = [
            dataclasses.replace(
                delivery.item,
                state=delivery.state,
                # A sent item only listens for reports now: its payload need not be carried.
                payload={} if delivery.state.status.is_final else delivery.item.payload,
            )
            for delivery in self._deliveries.values()
        ]
        lanes = [lane.carry() for lane in self._lanes.values()]
        later: list[str] = []
        # Asked at every continue-as-new, whatever it carries: its marker must not depend on a
        # size a later release may set otherwise. The next run admits what this release says.
        per_task = shard_contract.admit_per_task()
        if workflow.patched(_CARRY_IN_PARTS_PATCH) and _held_count(items, lanes) > per_task:
            items, lanes, later = _in_parts(items, lanes, per_task)
        workflow.continue_as_new(
            dataclasses.replace(
                self._start,
                poll_batch=self._polls.size,
                submit_batch=self._submits.size,
                items=items,
                recent=list(self._recent),
                lanes=lanes,
                lane_runs=self._lane_runs,
                later=later,
                admit_per_task=per_task,
            )
        )

    def _show_details(self) -> None:
        view = self.view()
        counts = ", ".join(f"{n} {status}" for status, n in sorted(view.by_status.items()))
        lanes = f"; {view.lanes} lanes holding {view.in_lanes} items" if view.lanes else ""
        if self._later:
            lanes += f"; {len(self._later)} carried parts or enqueues still to admit"
        workflow.set_current_details(
            f"Bulk shard {view.shard} of **{view.destination}**: {view.held} items held"
            f" ({counts or 'none'}){lanes}; {view.finished} finished in this run."
            " Each item's story is in the read model (`GET /v1/outboxes/{outbox}/items/{key}`)."
        )


def _held_count(items: list[OutboxItemInput], lanes: list[LaneState]) -> int:
    """What admitting these costs a workflow task, in `admit_per_task`'s units."""
    return len(items) + sum(1 + len(lane.entries) for lane in lanes)


def _in_parts(
    items: list[OutboxItemInput], lanes: list[LaneState], per_part: int
) -> tuple[list[OutboxItemInput], list[LaneState], list[str]]:
    """Cut what a run carries into parts of at most `per_part` (a lane is never cut: one larger
    than that is a part of its own): the first part's items and lanes, to carry as they are,
    and the JSON text of each other part."""
    parts: list[CarriedPart] = []
    room = 0
    for lane in lanes:
        size = 1 + len(lane.entries)
        if not parts or size > room:
            parts.append(CarriedPart())
            room = per_part
        parts[-1].lanes.append(lane)
        room -= size
    for item in items:
        if not parts or room < 1:
            parts.append(CarriedPart())
            room = per_part
        parts[-1].items.append(item)
        room -= 1
    first, *rest = parts
    return first.items, first.lanes, [carried_text.write(part) for part in rest]


def _last_heartbeat_details(err: ActivityError) -> list[Any]:
    """What a timed-out attempt's last heartbeat carried (none for another failure)."""
    cause = err.cause
    if isinstance(cause, ActivityTimeoutError) and cause.last_heartbeat_details:
        return list(cause.last_heartbeat_details)
    return []


def _read_enqueue(raw: RawValue) -> ShardEnqueue:
    batch = workflow.payload_converter().from_payload(raw.payload, ShardEnqueue)
    assert isinstance(batch, ShardEnqueue)
    return batch


def _read_part(text: str) -> CarriedPart:
    part = carried_text.read(text, CarriedPart)
    assert isinstance(part, CarriedPart)
    return part


def _generation_id(item: OutboxItemInput) -> str:
    """What the shard remembers of an item it finished: its id, and its generation once
    redriven (a redrive hands the same id over again)."""
    item_id = item_workflow_id(item.outbox, item.key)
    return item_id if item.generation == 0 else f"{item_id}#{item.generation}"


def _tick_after(at: datetime) -> datetime:
    """`at` rounded up to the next TICK boundary."""
    ticks = math.ceil((at - _EPOCH) / TICK)
    return _EPOCH + ticks * TICK
