"""The mailbox: concurrent calls for one key go out as batches, one batch at a time, in order."""

from __future__ import annotations

import asyncio

import pytest
from durable_outbox_temporal.mailbox import Mailbox


class Recorder:
    """A `send` that records each batch and holds it until released."""

    def __init__(self) -> None:
        self.batches: list[tuple[str, list[int]]] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.release = asyncio.Event()
        self.release.set()

    async def send(self, key: str, items: list[int]) -> list[int]:
        self.batches.append((key, list(items)))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await self.release.wait()
        self.in_flight -= 1
        return [item * 10 for item in items]


async def test_calls_waiting_behind_a_batch_go_together_in_order() -> None:
    recorder = Recorder()
    recorder.release.clear()
    mailbox: Mailbox[int, int] = Mailbox(recorder.send, max_batch=100)

    first = asyncio.create_task(mailbox.call("a", 0))
    await asyncio.sleep(0)
    rest = [asyncio.create_task(mailbox.call("a", n)) for n in range(1, 31)]
    await asyncio.sleep(0)
    assert mailbox.pending("a") == 30
    recorder.release.set()

    assert await first == 0
    assert await asyncio.gather(*rest) == [n * 10 for n in range(1, 31)]
    assert recorder.batches == [("a", [0]), ("a", list(range(1, 31)))]
    assert recorder.most_in_flight == 1
    assert mailbox.pending("a") == 0


async def test_keys_do_not_wait_for_each_other() -> None:
    recorder = Recorder()
    recorder.release.clear()
    mailbox: Mailbox[int, int] = Mailbox(recorder.send, max_batch=100)

    calls = [asyncio.create_task(mailbox.call(key, 1)) for key in ("a", "b", "c")]
    for _ in range(3):
        await asyncio.sleep(0)
    assert recorder.in_flight == 3
    recorder.release.set()

    assert await asyncio.gather(*calls) == [10, 10, 10]


async def test_a_batch_holds_at_most_max_batch_items_and_max_size_bytes() -> None:
    recorder = Recorder()
    recorder.release.clear()
    mailbox: Mailbox[int, int] = Mailbox(
        recorder.send, max_batch=3, size=lambda item: item, max_size=10
    )

    first = asyncio.create_task(mailbox.call("a", 1))
    await asyncio.sleep(0)
    # Sizes 4 4 4 would pass the count but not the bytes; 20 goes alone, larger than the bound.
    waiting = [asyncio.create_task(mailbox.call("a", n)) for n in (4, 4, 4, 20, 1, 1, 1, 1)]
    await asyncio.sleep(0)
    recorder.release.set()
    await asyncio.gather(first, *waiting)

    assert [items for _, items in recorder.batches] == [[1], [4, 4], [4], [20], [1, 1, 1], [1]]


async def test_a_caller_that_gives_up_before_its_batch_leaves_is_not_sent() -> None:
    recorder = Recorder()
    recorder.release.clear()
    mailbox: Mailbox[int, int] = Mailbox(recorder.send, max_batch=100)

    first = asyncio.create_task(mailbox.call("a", 1))
    await asyncio.sleep(0)
    given_up = asyncio.create_task(mailbox.call("a", 2))
    kept = asyncio.create_task(mailbox.call("a", 3))
    await asyncio.sleep(0)
    given_up.cancel()
    recorder.release.set()

    assert (await first, await kept) == (10, 30)
    assert recorder.batches == [("a", [1]), ("a", [3])]
    with pytest.raises(asyncio.CancelledError):
        await given_up


async def test_a_failed_batch_fails_each_of_its_callers_and_the_next_batch_still_goes() -> None:
    sent: list[list[int]] = []
    gate = asyncio.Event()

    async def send(_: str, items: list[int]) -> list[int]:
        sent.append(items)
        await gate.wait()
        if 2 in items:
            raise ConnectionError("Temporal unreachable")
        return items

    mailbox: Mailbox[int, int] = Mailbox(send, max_batch=2)
    calls = [asyncio.create_task(mailbox.call("a", n)) for n in (1, 2, 3, 4)]
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(*calls, return_exceptions=True)

    assert sent == [[1, 2], [3, 4]]
    assert all(isinstance(result, ConnectionError) for result in results[:2])
    assert results[2:] == [3, 4]


async def test_a_send_answering_the_wrong_count_fails_its_callers() -> None:
    async def send(_: str, items: list[int]) -> list[int]:
        return items[:-1]

    mailbox: Mailbox[int, int] = Mailbox(send, max_batch=10)

    with pytest.raises(RuntimeError, match="0 outcomes for a batch of 1"):
        await mailbox.call("a", 1)
