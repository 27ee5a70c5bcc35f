"""Live progress: one tailer per API process fans new events out to every socket.

The tailer polls the events table by cursor (`id > last`), one query per poll for every outbox
that has subscribers, each with its own cursor: the store guarantees ids of one outbox commit in
order, so nothing is skipped. With no subscriber it waits, polling nothing. A subscriber that
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

from sqlalchemy import Engine

from readmodel import store
from readmodel.models import EventRecord

log = logging.getLogger("outbox.live")

POLL_INTERVAL_S = 0.2
# Ten tailer batches: a client this far behind is not keeping up and is better reconnecting.
SUBSCRIBER_BUFFER = 5000
_BATCH = 500


class SubscriberTooSlow(Exception):
    """The subscriber's buffer overflowed; it must reconnect from its last seen id."""


@dataclass(eq=False)  # identity semantics: subscriptions live in sets
class Subscription:
    """A socket's feed: events arrive on `queue`; `overflowed` is set if it fell behind."""

    queue: asyncio.Queue[EventRecord] = field(
        default_factory=lambda: asyncio.Queue(SUBSCRIBER_BUFFER)
    )
    overflowed: asyncio.Event = field(default_factory=asyncio.Event)

    async def next(self) -> EventRecord:
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
    """The process's one tailer and the subscriptions it feeds, keyed by outbox."""

    def __init__(self, engine: Engine, limits: SocketLimits | None = None) -> None:
        self._engine = engine
        self.limits = limits or SocketLimits(most=500, per_holder=20)
        self._subscribers: dict[str, set[Subscription]] = {}
        # Where the tailer reads on from, per outbox with subscribers.
        self._cursors: dict[str, int] = {}
        self._tailer: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        # Polls made: tests count queries against it.
        self.polls = 0

    @property
    def tailers(self) -> int:
        """Tailer tasks running: one at most, whatever the number of outboxes followed."""
        return int(self._tailer is not None and not self._tailer.done())

    async def subscribe(self, outbox: str) -> Subscription:
        subscription = Subscription()
        self._subscribers.setdefault(outbox, set()).add(subscription)
        try:
            if outbox not in self._cursors:
                start = await asyncio.to_thread(store.last_event_id, self._engine, outbox)
                self._cursors.setdefault(outbox, start)
        except BaseException:
            self.unsubscribe(outbox, subscription)
            raise
        if self._tailer is None or self._tailer.done():
            self._tailer = asyncio.create_task(self._tail(), name="live-tailer")
        self._wake.set()
        return subscription

    def unsubscribe(self, outbox: str, subscription: Subscription) -> None:
        subscribers = self._subscribers.get(outbox, set())
        subscribers.discard(subscription)
        if not subscribers:
            self._subscribers.pop(outbox, None)
            self._cursors.pop(outbox, None)

    async def close(self) -> None:
        tailer, self._tailer = self._tailer, None
        if tailer is not None:
            tailer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await tailer
        self._subscribers.clear()
        self._cursors.clear()

    async def _tail(self) -> None:
        while True:
            if not self._cursors:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                events = await asyncio.to_thread(
                    store.events_since_each, self._engine, dict(self._cursors), _BATCH
                )
            except Exception:  # a DB hiccup must not kill live updates for good
                log.warning("live tailer: read failed; retrying", exc_info=True)
                events = []
            self.polls += 1
            for event in events:
                if event.id <= self._cursors.get(event.outbox, event.id):
                    continue  # nobody follows the outbox any more, or it started after this
                self._cursors[event.outbox] = event.id
                for subscription in list(self._subscribers.get(event.outbox, ())):
                    try:
                        subscription.queue.put_nowait(event)
                    except asyncio.QueueFull:
                        subscription.overflowed.set()
            if len(events) < _BATCH:
                await asyncio.sleep(POLL_INTERVAL_S)
