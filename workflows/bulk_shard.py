"""A bulk shard: many deliveries in one long-lived workflow (the bulk mode, `contract.bulk`).

The Cloudflare Queues v2 move (docs/explanation/seeds.md): one coordinator per queue became
sharded Durable Objects. Here a destination's items are spread over its shards by a hash of the
item id, and each shard runs `workflows.delivery.Delivery` for every item it holds, the very
state machine of the item workflow. What a shard does differently is what makes it cheap:

- its items share timers: each wait is rounded up to the next `TICK` and one durable timer wakes
  the shard for every wait due by then (a wait is never shorter than asked: Retry-After holds);
- their transitions are written by the submit and poll activities, like an item's, and the rest
  in batches: one local activity per batch of items instead of one per transition;
- items arrive in batches (one signal per shard for a batch enqueue);
- with `submit_batch`/`poll_batch`, submits and polls that fall due together share an activity
  (the destination's queues then count batches: see `common.destinations`);
- no per-item search attributes: the Web UI shows the shard and its counts; each item's story is
  in the read model.

It continues as new carrying its items (each with its state) once Temporal suggests it: new
submits and polls wait, the ones out finish, and the next run resumes every item where it was.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Generic, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.delivery import DeliveryActivities
    from activities.projection import ProjectionActivities
    from contract.bulk import (
        CANCEL_ITEM_SIGNAL,
        ENQUEUE_SIGNAL,
        ITEM_REPORT_SIGNAL,
        RECENT_KEPT,
        SHARD_QUERY,
        SHARD_WORKFLOW_TYPE,
        ItemCancel,
        ItemReport,
        ShardEnqueue,
        ShardInput,
        ShardView,
    )
    from contract.ids import item_workflow_id
    from contract.item import (
        DeliveryPolicy,
        ItemErrorType,
        ItemProjection,
        ItemStatus,
        OutboxItemInput,
        PollOutcome,
        PollRequest,
        SubmitOutcome,
        SubmitRequest,
    )
    from workflows.delivery import BATCH_RETRIES, Delivery, DeliveryFailed

# Waits are rounded up to this, so the items waiting in one tick share one timer.
TICK = timedelta(milliseconds=100)
# How long an empty shard stays for more items before it ends (a new enqueue starts it again).
LINGER = timedelta(seconds=30)
# Submits and polls one shard has out at once. Temporal keeps a workflow's pending activities
# in its mutable state, which the server rewrites at every step of that workflow: a shard with
# thousands out would make every step cost thousands. The rest wait their turn in the shard, for
# free. Why: docs/decisions/bulk-shards.md
MAX_OUT = 100
# Submit (and, apart, poll) activities of a batching shard out at once; the requests asked for
# meanwhile wait and fill the next batches (see `_Batcher`).
BATCHES_OUT = 4
# Projections one local activity writes at most.
PROJECTION_BATCH = 200
_PROJECTION_RETRIES = RetryPolicy(
    initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=30)
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

Request = TypeVar("Request", SubmitRequest, PollRequest)
Outcome = TypeVar("Outcome", SubmitOutcome, PollOutcome)


@dataclass
class _Batcher(Generic[Request, Outcome]):
    """Submits (or polls) asked for by the shard's deliveries, sent in activities of up to
    `size`, at most `BATCHES_OUT` at once.

    Each activity spends one of the queue's tokens however few items it carries, so a lone
    request would cost a whole batch's share of the rate. While `BATCHES_OUT` activities are out
    (waiting for the server to dispatch them, at the queue's rate, or running), new requests
    wait here and go out together when one comes back: the slower the queue, the fuller the
    batches."""

    activity: Callable[[DeliveryActivities, list[Request]], Awaitable[list[Outcome]]]
    task_queue: Callable[[DeliveryPolicy], str]
    timeout_s: Callable[[DeliveryPolicy], float]
    failed: Callable[[str], Outcome]
    noun: str
    size: int = 1
    _asked: list[tuple[Request, DeliveryPolicy, asyncio.Future[Outcome]]] = field(
        default_factory=list
    )
    _gathering: bool = False
    _out: int = 0

    async def ask(self, request: Request, policy: DeliveryPolicy) -> Outcome:
        outcome: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._asked.append((request, policy, outcome))
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
        while self._asked and self._out < BATCHES_OUT:
            batch, self._asked = self._asked[: self.size], self._asked[self.size :]
            self._out += 1
            asyncio.create_task(self._send_batch(batch))

    async def _send_batch(
        self, batch: list[tuple[Request, DeliveryPolicy, asyncio.Future[Outcome]]]
    ) -> None:
        policy = batch[0][1]
        try:
            outcomes = await workflow.execute_activity_method(
                self.activity,
                [request for request, _, _ in batch],
                task_queue=self.task_queue(policy),
                start_to_close_timeout=timedelta(seconds=self.timeout_s(policy)),
                retry_policy=BATCH_RETRIES,
                summary=f"{self.noun} {len(batch)} items",
            )
        except ActivityError as err:
            # The whole activity failed (after its retries): each item counts a failed request.
            outcomes = [self.failed(str(err.cause or err))] * len(batch)
        finally:
            self._out -= 1
        for (_, _, outcome), answered in zip(batch, outcomes, strict=True):
            outcome.set_result(answered)
        if self._asked:
            self._send_soon()


@workflow.defn(name=SHARD_WORKFLOW_TYPE)
class BulkShardWorkflow:
    """Holds a destination's items of one shard and delivers each with the shared machine."""

    @workflow.init
    def __init__(self, start: ShardInput) -> None:
        self._start = start
        self._deliveries: dict[str, Delivery] = {}
        self._running: dict[str, asyncio.Task[None]] = {}
        self._recent: collections.deque[str] = collections.deque(start.recent, maxlen=RECENT_KEPT)
        self._finished = 0
        # Batched projections, each with the future its delivery waits on.
        self._to_project: list[tuple[ItemProjection, asyncio.Future[None]]] = []
        self._flushing = False
        # The shared timer: when it is set to fire, and whether a wait wants it earlier.
        self._timer_at: datetime | None = None
        self._wake_ats: list[datetime] = []
        self._rearm = False
        self._draining = False
        # Submits and polls out (at most MAX_OUT), and the deliveries waiting for a turn.
        self._out = 0
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        # Submits and polls asked for in this step and not yet sent.
        self._submits: _Batcher[SubmitRequest, SubmitOutcome] = _Batcher(
            DeliveryActivities.submit_items,
            lambda policy: policy.submit_task_queue,
            lambda policy: policy.submit_timeout_s,
            lambda message: SubmitOutcome(error_type=ItemErrorType.TRANSIENT, message=message),
            "submit",
            start.submit_batch,
        )
        self._polls: _Batcher[PollRequest, PollOutcome] = _Batcher(
            DeliveryActivities.poll_operations,
            lambda policy: policy.poll_task_queue,
            lambda policy: policy.poll_timeout_s,
            lambda message: PollOutcome(error_type=ItemErrorType.TRANSIENT, message=message),
            "poll",
            start.poll_batch,
        )

    @workflow.run
    async def run(self, start: ShardInput) -> None:
        for item in start.items:
            self._admit(item)
        while True:
            self._show_details()
            if self._should_continue_as_new():
                await self._continue_as_new()
            if not self._deliveries:
                # Empty: linger for more items, then end (the next enqueue starts it again).
                try:
                    await workflow.wait_condition(
                        lambda: bool(self._deliveries), timeout=LINGER, timeout_summary="linger"
                    )
                except TimeoutError:
                    if not self._deliveries and workflow.all_handlers_finished():
                        return
                continue
            self._rearm = False
            due = self._next_wake_at()
            timeout = None if due is None else max(due - workflow.now(), timedelta(0))
            try:
                await workflow.wait_condition(
                    lambda: self._rearm or not self._deliveries or self._should_continue_as_new(),
                    timeout=timeout,
                    timeout_summary="next wake-up",
                )
            except TimeoutError:
                self._timer_at = None

    @workflow.signal(name=ENQUEUE_SIGNAL)
    def enqueue_items(self, batch: ShardEnqueue) -> None:
        # The destination's batch sizes as configured now: a changed config applies from the
        # next enqueue, like the worker's queue rates from its next start.
        if batch.submit_batch is not None:
            self._submits.size = batch.submit_batch
        if batch.poll_batch is not None:
            self._polls.size = batch.poll_batch
        for item in batch.items:
            self._admit(item)

    @workflow.signal(name=CANCEL_ITEM_SIGNAL)
    def cancel_item(self, cancel: ItemCancel) -> None:
        delivery = self._deliveries.get(cancel.item_id)
        if delivery is not None:
            delivery.request_cancel(cancel.request)

    @workflow.signal(name=ITEM_REPORT_SIGNAL)
    async def item_delivery_report(self, routed: ItemReport) -> None:
        delivery = self._deliveries.get(routed.item_id)
        if delivery is not None:
            await delivery.delivery_report(routed.report)

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
        )

    # -- items ---------------------------------------------------------------------------------

    def _admit(self, item: OutboxItemInput) -> None:
        item_id = item_workflow_id(item.outbox, item.key)
        if item_id in self._deliveries or _generation_id(item) in self._recent:
            return  # a repeated enqueue (a client's retry): the item is here or was
        delivery = Delivery(item_id, item, self)
        self._deliveries[item_id] = delivery
        self._running[item_id] = asyncio.create_task(self._deliver(delivery))

    async def _deliver(self, delivery: Delivery) -> None:
        item = delivery.item
        if not delivery.state.started and item.not_before is not None:
            remaining = item.not_before - workflow.now()
            if remaining > timedelta(0):
                await self.wait(remaining, "not before", lambda: delivery.state.cancel_requested)
        # A failure is recorded and projected: the read model holds it as a dead letter.
        with contextlib.suppress(DeliveryFailed):
            await delivery.run()
        del self._deliveries[delivery.item_id]
        del self._running[delivery.item_id]
        self._recent.append(_generation_id(item))
        self._finished += 1

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
                await workflow.execute_local_activity_method(
                    ProjectionActivities.project_items,
                    [projection for projection, _ in batch],
                    start_to_close_timeout=timedelta(seconds=30),
                    retry_policy=_PROJECTION_RETRIES,
                    summary=f"project {len(batch)} items to read model",
                )
                for _, done in batch:
                    done.set_result(None)
        finally:
            self._flushing = False

    def status_changed(self, status: ItemStatus) -> None:
        """No search attribute per item: the shard's counts are in its current details."""

    def show_details(self, lines: list[str]) -> None:
        """One item's details would be lost among many: the shard shows its counts instead."""

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

    def gate(self) -> Awaitable[None] | None:
        if self._draining:
            # Held until the run continues as new (which resumes it from its state).
            return workflow.wait_condition(lambda: False)
        if self._out < MAX_OUT:
            self._out += 1
            return None
        # First come, first served: each answered submit or poll wakes the longest waiting.
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(turn)
        return turn

    def submit_batched(self) -> bool:
        return self._submits.size > 1

    async def submit(self, request: SubmitRequest, policy: DeliveryPolicy) -> SubmitOutcome:
        """Join the submits asked for in this step; one activity per `submit_batch` of them."""
        return await self._submits.ask(request, policy)

    def poll_batched(self) -> bool:
        return self._polls.size > 1

    async def poll(self, request: PollRequest, policy: DeliveryPolicy) -> PollOutcome:
        """Join the polls asked for in this step; one activity per `poll_batch` of them."""
        return await self._polls.ask(request, policy)

    def release(self) -> None:
        self._out -= 1
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                break

    async def checkpoint(self, delivery: Delivery) -> None:
        """The shard continues as new as a whole (see the module docstring)."""

    # -- the shared timer and continue-as-new ----------------------------------------------------

    def _next_wake_at(self) -> datetime | None:
        now = workflow.now()
        self._wake_ats = [at for at in self._wake_ats if at > now]
        self._timer_at = min(self._wake_ats, default=None)
        return self._timer_at

    def _should_continue_as_new(self) -> bool:
        return bool(self._deliveries) and workflow.info().is_continue_as_new_suggested()

    async def _continue_as_new(self) -> None:
        self._draining = True
        # Submits and polls out finish (new ones wait at the gate), projections are written.
        await workflow.wait_condition(
            lambda: (
                not self._flushing
                and not any(d.activity_out for d in self._deliveries.values())
                and workflow.all_handlers_finished()
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
        workflow.continue_as_new(
            ShardInput(
                destination=self._start.destination,
                shard=self._start.shard,
                poll_batch=self._polls.size,
                submit_batch=self._submits.size,
                items=items,
                recent=list(self._recent),
            )
        )

    def _show_details(self) -> None:
        view = self.view()
        counts = ", ".join(f"{n} {status}" for status, n in sorted(view.by_status.items()))
        workflow.set_current_details(
            f"Bulk shard {view.shard} of **{view.destination}**: {view.held} items held"
            f" ({counts or 'none'}); {view.finished} finished in this run."
            " Each item's story is in the read model (`GET /v1/outboxes/{outbox}/items/{key}`)."
        )


def _generation_id(item: OutboxItemInput) -> str:
    """What the shard remembers of an item it finished: its id, and its generation once
    redriven (a redrive hands the same id over again)."""
    item_id = item_workflow_id(item.outbox, item.key)
    return item_id if item.generation == 0 else f"{item_id}#{item.generation}"


def _tick_after(at: datetime) -> datetime:
    """`at` rounded up to the next TICK boundary."""
    ticks = math.ceil((at - _EPOCH) / TICK)
    return _EPOCH + ticks * TICK
