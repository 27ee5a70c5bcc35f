"""Live progress: one tailer per outbox per API process fans new events out to every socket.

The tailer polls the events table by cursor (`id > last`), which is cheap and works on SQLite and
PostgreSQL alike; the store guarantees ids of one outbox commit in order, so nothing is skipped.
A subscriber that cannot keep up is dropped rather than allowed to slow the others: it reconnects
with `?since=<last id>` and misses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from sqlalchemy import Engine

from readmodel import store
from readmodel.models import EventRecord

log = logging.getLogger("outbox.live")

POLL_INTERVAL_S = 0.2
# Ten tailer batches: a client this far behind is not keeping up and is better reconnecting.
SUBSCRIBER_BUFFER = 5000


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
        getter = asyncio.ensure_future(self.queue.get())
        dropped = asyncio.ensure_future(self.overflowed.wait())
        done, _ = await asyncio.wait({getter, dropped}, return_when=asyncio.FIRST_COMPLETED)
        if getter in done:
            dropped.cancel()
            return getter.result()
        getter.cancel()
        raise SubscriberTooSlow


class LiveHub:
    """Tailers keyed by outbox; a tailer runs only while its outbox has subscribers."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._subscribers: dict[str, set[Subscription]] = {}
        self._tailers: dict[str, asyncio.Task[None]] = {}

    async def subscribe(self, outbox: str) -> Subscription:
        subscription = Subscription()
        self._subscribers.setdefault(outbox, set()).add(subscription)
        if outbox not in self._tailers:
            start = await asyncio.to_thread(store.last_event_id, self._engine, outbox)
            if outbox not in self._tailers:
                self._tailers[outbox] = asyncio.create_task(self._tail(outbox, start))
        return subscription

    def unsubscribe(self, outbox: str, subscription: Subscription) -> None:
        subscribers = self._subscribers.get(outbox, set())
        subscribers.discard(subscription)
        if not subscribers:
            self._subscribers.pop(outbox, None)
            tailer = self._tailers.pop(outbox, None)
            if tailer is not None:
                tailer.cancel()

    async def close(self) -> None:
        tailers = list(self._tailers.values())
        self._tailers.clear()
        for tailer in tailers:
            tailer.cancel()
        for tailer in tailers:
            with contextlib.suppress(asyncio.CancelledError):
                await tailer
        self._subscribers.clear()

    async def _tail(self, outbox: str, last_id: int) -> None:
        while True:
            try:
                events = await asyncio.to_thread(
                    store.events_since, self._engine, outbox, last_id, 500
                )
            except Exception:  # a DB hiccup must not kill live updates for good
                log.warning("live tailer for %s: read failed; retrying", outbox, exc_info=True)
                events = []
            for event in events:
                last_id = event.id
                for subscription in list(self._subscribers.get(outbox, ())):
                    try:
                        subscription.queue.put_nowait(event)
                    except asyncio.QueueFull:
                        subscription.overflowed.set()
            if len(events) < 500:
                await asyncio.sleep(POLL_INTERVAL_S)
