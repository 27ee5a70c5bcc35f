"""Live progress: one tailer per API process fans new events out to every socket.

The tailer polls the events table by cursor (`id > last`), one query per poll for every outbox
that has subscribers, each with its own cursor: the store guarantees ids of one outbox commit in
order, so nothing is skipped. Aggregate sockets are fed by the same tailer, with one more query
per poll for every aggregate followed, each by its own seq. With no subscriber it waits, polling
nothing. A subscriber that
cannot keep up is dropped rather than allowed to slow the others: it reconnects with
`?since=<last id>` and misses nothing.

`SocketLimits` bounds the sockets one process holds open (`LIVE_SOCKETS_MAX`) and those of one
token (`LIVE_SOCKETS_PER_TOKEN`), outbox and aggregate streams alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from durable_outbox_temporal.contract.aggregate import RecordedEvent
from sqlalchemy import Engine

from readmodel import aggregates as event_store
from readmodel import store
from readmodel.db import in_thread
from readmodel.models import EventRecord

log = logging.getLogger("outbox.live")

POLL_INTERVAL_S = 0.2
# Ten tailer batches: a client this far behind is not keeping up and is better reconnecting.
SUBSCRIBER_BUFFER = 5000
_BATCH = 500


class SubscriberTooSlow(Exception):
    """The subscriber's buffer overflowed; it must reconnect from its last seen id."""


Event = TypeVar("Event", EventRecord, RecordedEvent)
# An aggregate followed: its type and id.
AggregateKey = tuple[str, str]


@dataclass(eq=False)  # identity semantics: subscriptions live in sets
class Subscription(Generic[Event]):
    """A socket's feed: events arrive on `queue`; `overflowed` is set if it fell behind."""

    queue: asyncio.Queue[Event] = field(default_factory=lambda: asyncio.Queue(SUBSCRIBER_BUFFER))
    overflowed: asyncio.Event = field(default_factory=asyncio.Event)

    def offer(self, event: Event) -> None:
        """Queue `event`, or mark the subscriber as fallen behind if its buffer is full."""
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.overflowed.set()

    async def next(self) -> Event:
        """The next event; raises `SubscriberTooSlow` once the buffer has overflowed."""
        if not self.queue.empty():
            return self.queue.get_nowait()
        if self.overflowed.is_set():
            raise SubscriberTooSlow
        getter = asyncio.ensure_future(self.queue.get())
        dropped = asyncio.ensure_future(self.overflowed.wait())
        try:
            done, _ = await asyncio.wait({getter, dropped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Cancelled or not, leave no waiter behind: a pending task destroyed with its socket
            # is logged at ERROR ("Task was destroyed but it is pending!").
            for waiter in (getter, dropped):
                waiter.cancel()
        if getter in done and not getter.cancelled():
            return getter.result()
        raise SubscriberTooSlow


class SocketLimits:
    """Open live sockets per process and per holder (a token's name, or a client address)."""

    def __init__(self, most: int, per_holder: int) -> None:
        self.most = most
        self.per_holder = per_holder
        self._open: Counter[str] = Counter()

    @property
    def open(self) -> int:
        return self._open.total()

    def acquire(self, holder: str) -> str | None:
        """Take a slot for `holder`; None if taken, else why not."""
        if self.open >= self.most:
            return f"this API process holds its most live sockets ({self.most}, LIVE_SOCKETS_MAX)"
        if self._open[holder] >= self.per_holder:
            return (
                f"this token holds its most live sockets ({self.per_holder},"
                " LIVE_SOCKETS_PER_TOKEN)"
            )
        self._open[holder] += 1
        return None

    def release(self, holder: str) -> None:
        self._open[holder] -= 1
        if self._open[holder] <= 0:
            del self._open[holder]


class LiveHub:
    """The process's one tailer and the subscriptions it feeds, keyed by outbox or aggregate."""

    def __init__(self, engine: Engine, limits: SocketLimits | None = None) -> None:
        self._engine = engine
        self.limits = limits or SocketLimits(most=500, per_holder=20)
        self._subscribers: dict[str, set[Subscription[EventRecord]]] = {}
        # Where the tailer reads on from, per outbox with subscribers.
        self._cursors: dict[str, int] = {}
        self._aggregate_subscribers: dict[AggregateKey, set[Subscription[RecordedEvent]]] = {}
        # The last seq fanned out, per aggregate with subscribers.
        self._aggregate_cursors: dict[AggregateKey, int] = {}
        self._tailer: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        # Polls made: tests count queries against it.
        self.polls = 0

    @property
    def tailers(self) -> int:
        """Tailer tasks running: one at most, whatever the number of outboxes followed."""
        return int(self._tailer is not None and not self._tailer.done())

    async def subscribe(self, outbox: str) -> Subscription[EventRecord]:
        subscription: Subscription[EventRecord] = Subscription()
        self._subscribers.setdefault(outbox, set()).add(subscription)
        try:
            if outbox not in self._cursors:
                start = await asyncio.to_thread(store.last_event_id, self._engine, outbox)
                self._cursors.setdefault(outbox, start)
        except BaseException:
            self.unsubscribe(outbox, subscription)
            raise
        self._start()
        return subscription

    def unsubscribe(self, outbox: str, subscription: Subscription[EventRecord]) -> None:
        subscribers = self._subscribers.get(outbox, set())
        subscribers.discard(subscription)
        if not subscribers:
            self._subscribers.pop(outbox, None)
            self._cursors.pop(outbox, None)

    def subscribe_aggregate(self, key: AggregateKey, version: int) -> Subscription[RecordedEvent]:
        """Events of the aggregate with seq above `version` (its stored version as the socket
        opens), or above where the tailer already is for it."""
        subscription: Subscription[RecordedEvent] = Subscription()
        self._aggregate_subscribers.setdefault(key, set()).add(subscription)
        self._aggregate_cursors.setdefault(key, version)
        self._start()
        return subscription

    def unsubscribe_aggregate(
        self, key: AggregateKey, subscription: Subscription[RecordedEvent]
    ) -> None:
        subscribers = self._aggregate_subscribers.get(key, set())
        subscribers.discard(subscription)
        if not subscribers:
            self._aggregate_subscribers.pop(key, None)
            self._aggregate_cursors.pop(key, None)

    def _start(self) -> None:
        if self._tailer is None or self._tailer.done():
            self._tailer = asyncio.create_task(self._tail(), name="live-tailer")
        self._wake.set()

    async def close(self) -> None:
        tailer, self._tailer = self._tailer, None
        if tailer is not None:
            tailer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await tailer
        self._subscribers.clear()
        self._cursors.clear()
        self._aggregate_subscribers.clear()
        self._aggregate_cursors.clear()

    async def _tail(self) -> None:
        while True:
            if not self._cursors and not self._aggregate_cursors:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                full = await self._poll_outboxes()
                full = await self._poll_aggregates() or full
            except Exception:  # a DB hiccup must not kill live updates for good
                log.warning("live tailer: read failed; retrying", exc_info=True)
                full = False
            self.polls += 1
            if not full:
                await asyncio.sleep(POLL_INTERVAL_S)

    async def _poll_outboxes(self) -> bool:
        """Fan out the followed outboxes' new events; True if a whole batch came."""
        if not self._cursors:
            return False
        events = await in_thread(store.events_since_each, self._engine, dict(self._cursors), _BATCH)
        for event in events:
            if event.id <= self._cursors.get(event.outbox, event.id):
                continue  # nobody follows the outbox any more, or it started after this
            self._cursors[event.outbox] = event.id
            for subscription in list(self._subscribers.get(event.outbox, ())):
                subscription.offer(event)
        return len(events) >= _BATCH

    async def _poll_aggregates(self) -> bool:
        """Fan out the followed aggregates' new events; True if a whole batch came."""
        if not self._aggregate_cursors:
            return False
        events = await in_thread(
            event_store.events_after_each, self._engine, dict(self._aggregate_cursors), _BATCH
        )
        for key, event in events:
            if event.seq <= self._aggregate_cursors.get(key, event.seq):
                continue  # nobody follows the aggregate any more, or it started after this
            self._aggregate_cursors[key] = event.seq
            for subscription in list(self._aggregate_subscribers.get(key, ())):
                subscription.offer(event)
        return len(events) >= _BATCH
