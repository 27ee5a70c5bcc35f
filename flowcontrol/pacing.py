"""Spacing of one worker process's provider requests, under the server's rate limit.

The Temporal server enforces each destination queue's rate on *dispatches*, across all workers,
with a token bucket that lets one second's worth through at once after an idle spell (a worker
restart, a resume). What the provider counts is *arrivals*: a request leaves a busy worker a
varying moment after its dispatch, so a full bucket's burst plus the steady rate plus that
jitter let more than two seconds' worth arrive in single seconds after a restart. Each process
therefore also spaces its own requests to a queue at the rate the server holds that queue to,
with a burst of a quarter second's worth: one process alone starts at most
`rate x (window + 0.25 s)` requests in any window, and several together are still held to the
rate by the server (why, and what was measured: docs/decisions/pacing.md). The rate is read
back from the server (`flowcontrol.queue_rates`) every `refresh_s`, in the background (a request
never waits for that read), so a rate changed at run time holds here too.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from durable_outbox_temporal.contract.priority import rank
from temporalio.client import Client

from flowcontrol.queue_rates import read_queue_rate

if TYPE_CHECKING:
    from durable_outbox_temporal.destinations import Destination

# A quarter second's worth at once: a batch (at most a quarter of its rate, see `BATCH_RULE`)
# goes out whole.
BURST_S = 0.25


@dataclass(frozen=True)
class PacedQueue:
    """A destination queue as its requests are paced: its task queue, the configured rate in
    requests a second, and how many requests one of its activities carries (`*_batch`)."""

    task_queue: str
    configured_rate: float
    batch: int = 1


def paced_queues(destinations: Sequence[Destination]) -> dict[str, PacedQueue]:
    """The submit and poll queues of `destinations`, by task queue name."""
    queues = {}
    for destination in destinations:
        for queue in (
            PacedQueue(
                destination.submit_task_queue, destination.submit_rate, destination.submit_batch
            ),
            # With `poll_in_submit`, the poll queue's share of the poll rate (the first polls go
            # with the submits, paced as those).
            PacedQueue(
                destination.poll_task_queue,
                destination.poll_queue_rate * destination.poll_batch,
                destination.poll_batch,
            ),
        ):
            queues[queue.task_queue] = queue
    return queues


# The rate (activities a second) the server enforces on a task queue now, or None to use the
# configured one; 0 while paused.
QueueRateReader = Callable[[str], Awaitable[float | None]]


@dataclass
class _Bucket:
    rate: float
    checked_at: float
    # When the next request would go at the steady rate (GCRA's theoretical arrival time).
    next_at: float = 0.0
    # Requests waiting for a slot: (priority rank, arrival number, its turn), most urgent first.
    waiting: list[tuple[int, int, asyncio.Future[None]]] = field(default_factory=list)
    arrivals: int = 0
    # The task that hands out the slots to the waiting requests, one at each slot's time.
    serving: asyncio.Task[None] | None = None


class RequestPacer:
    """Waits, per queue, until one more request keeps this process within the queue's rate."""

    def __init__(
        self,
        queues: dict[str, PacedQueue],
        read_rate: QueueRateReader | None = None,
        *,
        refresh_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self._queues = queues
        self._read_rate = read_rate
        self._refresh_s = refresh_s
        self._clock = clock
        self._sleep = sleep
        self._buckets: dict[str, _Bucket] = {}
        self._refreshes: set[asyncio.Task[None]] = set()

    async def acquire(self, task_queue: str, priority: int | None = None) -> None:
        """Return when one request to `task_queue` may go; a queue not paced goes at once.

        Requests that must wait get their slots most urgent `priority` first (1 before 5;
        `durable_outbox_temporal/contract/priority.py`), in arrival order within one priority."""
        queue = self._queues.get(task_queue)
        if queue is None:
            return
        bucket = self._bucket(queue)
        if not bucket.waiting and self._due_in(bucket) <= 0:
            self._take(bucket)
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        bucket.arrivals += 1
        heapq.heappush(bucket.waiting, (rank(priority), bucket.arrivals, turn))
        if bucket.serving is None or bucket.serving.done():
            bucket.serving = asyncio.get_running_loop().create_task(self._serve(bucket))
        await turn

    def _due_in(self, bucket: _Bucket) -> float:
        """Seconds until one more request keeps this process within the rate (<= 0: now)."""
        now = self._clock()
        interval = 1 / bucket.rate
        tolerance = max(1.0, bucket.rate * BURST_S) * interval
        return max(bucket.next_at, now) - tolerance + interval - now

    def _take(self, bucket: _Bucket) -> None:
        bucket.next_at = max(bucket.next_at, self._clock()) + 1 / bucket.rate

    async def _serve(self, bucket: _Bucket) -> None:
        """Hand each slot, when it comes, to the most urgent request waiting."""
        while bucket.waiting:
            wait = self._due_in(bucket)
            if wait > 0:
                await self._sleep(wait)
                continue
            _, _, turn = heapq.heappop(bucket.waiting)
            if turn.done():
                continue  # its activity was cancelled while it waited
            self._take(bucket)
            turn.set_result(None)

    def rate(self, task_queue: str) -> float | None:
        """Requests a second this process paces `task_queue` at now (None: not paced yet)."""
        bucket = self._buckets.get(task_queue)
        return None if bucket is None else bucket.rate

    def _bucket(self, queue: PacedQueue) -> _Bucket:
        bucket = self._buckets.get(queue.task_queue)
        now = self._clock()
        if bucket is None:
            bucket = _Bucket(rate=queue.configured_rate, checked_at=now - self._refresh_s)
            self._buckets[queue.task_queue] = bucket
        if self._read_rate is not None and now - bucket.checked_at >= self._refresh_s:
            bucket.checked_at = now
            refresh = asyncio.get_running_loop().create_task(self._refresh(queue, bucket))
            # Held until done: the loop keeps only weak references to tasks.
            self._refreshes.add(refresh)
            refresh.add_done_callback(self._refreshes.discard)
        return bucket

    async def _refresh(self, queue: PacedQueue, bucket: _Bucket) -> None:
        bucket.rate = await self._rate_in_force(queue, bucket.rate)

    async def _rate_in_force(self, queue: PacedQueue, current: float) -> float:
        """Requests a second the server holds the queue to; the current rate when it cannot say
        or holds it at 0 (a paused queue dispatches nothing new; what it already dispatched
        goes at the rate it was dispatched at)."""
        assert self._read_rate is not None
        try:
            activities_per_s = await self._read_rate(queue.task_queue)
        except Exception:
            return current
        if activities_per_s is None:
            return queue.configured_rate
        if activities_per_s <= 0:
            return current
        return activities_per_s * queue.batch


def server_rate_reader(client: Client) -> QueueRateReader:
    """Reads a queue's rate from the server: the run-time one (`PATCH /v1/destinations`) if an
    operator set one, else None (the configured rate, which the workers ask for)."""

    async def read(task_queue: str) -> float | None:
        rate = await read_queue_rate(client, task_queue)
        return rate.rate if rate.source == "api" else None

    return read
