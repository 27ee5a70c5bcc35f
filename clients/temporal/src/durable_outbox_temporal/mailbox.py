"""A mailbox per key that turns concurrent calls into batches.

While one batch of a key is in flight, further calls for that key wait and go together as the
next batch, in the order they came: one caller at a time pays one round trip, many callers share
one. Aggregates use it so that any number of callers in a process send at most one update at a
time to an aggregate, well within Temporal's 10 updates in flight per workflow
(docs/decisions/aggregate-command-batches.md).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Item = TypeVar("Item")
Outcome = TypeVar("Outcome")
# Sends one key's batch and answers one outcome per item, in order.
SendBatch = Callable[[str, list[Item]], Awaitable[Sequence[Outcome]]]


@dataclass
class _Box(Generic[Item, Outcome]):
    waiting: deque[tuple[Item, asyncio.Future[Outcome]]] = field(default_factory=deque)
    sender: asyncio.Task[None] | None = None


class Mailbox(Generic[Item, Outcome]):
    """Calls for one key go out as batches of at most `max_batch` items, one batch at a time.

    A caller that gives up while its item still waits takes it out of the next batch; once the
    batch is sent, its item runs whatever the caller does. A batch that fails as a whole (the
    server unreachable) fails each of its callers with that error.
    """

    def __init__(
        self,
        send: SendBatch[Item, Outcome],
        *,
        max_batch: int,
        size: Callable[[Item], int] = lambda _: 0,
        max_size: int = 0,
    ) -> None:
        """`size` and `max_size` bound a batch's bytes too (0: no bound); an item larger than
        `max_size` goes alone."""
        self._send = send
        self._max_batch = max_batch
        self._size = size
        self._max_size = max_size
        self._boxes: dict[str, _Box[Item, Outcome]] = {}

    async def call(self, key: str, item: Item) -> Outcome:
        """Queue `item` for `key` and wait for its outcome."""
        box = self._boxes.setdefault(key, _Box())
        answer: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        box.waiting.append((item, answer))
        if box.sender is None:
            box.sender = asyncio.create_task(self._send_all(key, box))
        return await answer

    def pending(self, key: str) -> int:
        """Items waiting for `key` (not counting a batch in flight)."""
        box = self._boxes.get(key)
        return len(box.waiting) if box else 0

    async def _send_all(self, key: str, box: _Box[Item, Outcome]) -> None:
        try:
            while box.waiting:
                batch = self._next_batch(box)
                if batch:
                    await self._send_batch(key, batch)
        finally:
            box.sender = None
            if box.waiting:  # cancelled mid-way (shutdown): the next call starts a sender
                for _, answer in box.waiting:
                    if not answer.done():
                        answer.set_exception(RuntimeError("mailbox closed"))
                box.waiting.clear()
            if self._boxes.get(key) is box:
                del self._boxes[key]

    def _next_batch(self, box: _Box[Item, Outcome]) -> list[tuple[Item, asyncio.Future[Outcome]]]:
        batch: list[tuple[Item, asyncio.Future[Outcome]]] = []
        size = 0
        while box.waiting and len(batch) < self._max_batch:
            item, answer = box.waiting[0]
            if answer.done():  # its caller gave up before it was sent
                box.waiting.popleft()
                continue
            item_size = self._size(item)
            if batch and self._max_size and size + item_size > self._max_size:
                break
            box.waiting.popleft()
            batch.append((item, answer))
            size += item_size
        return batch

    async def _send_batch(
        self, key: str, batch: list[tuple[Item, asyncio.Future[Outcome]]]
    ) -> None:
        try:
            outcomes = await self._send(key, [item for item, _ in batch])
        except asyncio.CancelledError:
            for _, answer in batch:
                answer.cancel()
            raise
        except Exception as err:
            for _, answer in batch:
                if not answer.done():
                    answer.set_exception(err)
            return
        if len(outcomes) != len(batch):
            error = RuntimeError(f"{len(outcomes)} outcomes for a batch of {len(batch)}")
            for _, answer in batch:
                if not answer.done():
                    answer.set_exception(error)
            return
        for (_, answer), outcome in zip(batch, outcomes, strict=True):
            if not answer.done():
                answer.set_result(outcome)
