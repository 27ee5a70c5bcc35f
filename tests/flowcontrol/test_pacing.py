"""One process's provider requests spaced at its queue's rate (flowcontrol/pacing.py)."""

from __future__ import annotations

import asyncio
import time

from durable_outbox_temporal.destinations import Destination

from flowcontrol.pacing import PacedQueue, RequestPacer, paced_queues


class FakeClock:
    """A clock that only moves when the pacer sleeps (or the test says so)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


def busiest_second(times: list[float]) -> int:
    return max(sum(1 for t in times if start <= t < start + 1) for start in times)


async def send(pacer: RequestPacer, clock: FakeClock, queue: str, count: int) -> list[float]:
    times = []
    for _ in range(count):
        await pacer.acquire(queue)
        times.append(clock.now)
    return times


async def test_a_quarter_seconds_burst_then_the_steady_rate() -> None:
    clock = FakeClock()
    pacer = RequestPacer({"q": PacedQueue("q", 20.0)}, clock=clock, sleep=clock.sleep)
    times = await send(pacer, clock, "q", 45)
    assert times[:5] == [100.0] * 5  # 20/s x 0.25 s at once
    gaps = [round(b - a, 6) for a, b in zip(times[5:], times[6:], strict=False)]
    assert set(gaps) == {0.05}
    # What the provider sees from this process in any second: the burst plus the rate.
    assert busiest_second(times) == 25


async def test_a_slow_queue_sends_one_at_a_time() -> None:
    clock = FakeClock()
    pacer = RequestPacer({"q": PacedQueue("q", 2.0)}, clock=clock, sleep=clock.sleep)
    assert await send(pacer, clock, "q", 3) == [100.0, 100.5, 101.0]


async def test_an_idle_queue_gets_its_burst_back_and_other_queues_are_not_paced() -> None:
    clock = FakeClock()
    pacer = RequestPacer({"q": PacedQueue("q", 4.0)}, clock=clock, sleep=clock.sleep)
    await send(pacer, clock, "q", 5)
    clock.now += 10
    rested = clock.now
    assert await send(pacer, clock, "q", 2) == [rested, rested + 0.25]
    before = clock.now
    await send(pacer, clock, "unpaced", 100)
    assert clock.now == before


async def test_concurrent_requests_queue_behind_each_other() -> None:
    pacer = RequestPacer({"q": PacedQueue("q", 200.0)})
    started = time.monotonic()
    await asyncio.gather(*(pacer.acquire("q") for _ in range(70)))
    # 50 go at once (a quarter second at 200/s), the other 20 at 5 ms each: 0.1 s, never less.
    # A loaded machine wakes the last sleeper late, so the top bound is only below what 70 at
    # 5 ms each would take without the burst (0.35 s).
    elapsed = time.monotonic() - started
    assert 0.095 <= elapsed < 0.3, elapsed


async def test_the_rate_follows_the_server_run_time_rate_read_in_the_background() -> None:
    clock = FakeClock()
    answers: list[float | None | Exception] = [2.0, 0.0, RuntimeError("unavailable"), None]
    read: list[str] = []
    reading = asyncio.Event()

    async def read_rate(task_queue: str) -> float | None:
        read.append(task_queue)
        await reading.wait()
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    # A batching queue: the server counts activities of 5 requests each.
    queue = PacedQueue("q", 40.0, batch=5)
    pacer = RequestPacer({"q": queue}, read_rate, refresh_s=5, clock=clock, sleep=clock.sleep)

    async def rate_after_refresh() -> float | None:
        clock.now += 60  # the last reading is stale: the next request starts another
        await pacer.acquire("q")
        reading.set()
        for _ in range(5):
            await asyncio.sleep(0)
        reading.clear()
        return pacer.rate("q")

    # The first request went at the configured rate, without waiting for the server's answer.
    clock.now += 60
    await asyncio.wait_for(pacer.acquire("q"), timeout=1)
    assert pacer.rate("q") == 40.0
    reading.set()
    for _ in range(5):
        await asyncio.sleep(0)
    reading.clear()
    assert pacer.rate("q") == 10.0  # 2 activities/s x 5, set at run time
    assert await rate_after_refresh() == 10.0  # paused (0): what was dispatched goes on at it
    assert await rate_after_refresh() == 10.0  # the server could not say: the rate stays
    assert await rate_after_refresh() == 40.0  # no run-time rate: the configured 40/s
    assert read == ["q"] * 4


def test_a_poll_in_submit_destinations_poll_queue_is_paced_at_its_share() -> None:
    destination = Destination.model_validate(
        {
            "name": "mail",
            "provider": "acs-email",
            "poll_in_submit": True,
            "submit_rate": 2,
            "poll_rate": 5,
            "poll_interval_s": 0.5,
        }
    )

    queues = paced_queues([destination])

    # The first polls go with the submits (paced as those); the poll queue paces the rest.
    assert queues[destination.submit_task_queue].configured_rate == 2
    assert queues[destination.poll_task_queue].configured_rate == 3


async def test_waiting_requests_get_their_slots_most_urgent_first() -> None:
    # 20/s with a quarter second's burst: five go at once, the rest wait 50 ms apart.
    pacer = RequestPacer({"q": PacedQueue("q", 20.0)})
    for _ in range(5):
        await pacer.acquire("q")
    order: list[str] = []

    async def one(name: str, priority: int | None) -> None:
        await pacer.acquire("q", priority)
        order.append(name)

    waiting = [asyncio.create_task(one(f"backlog-{n}", 5)) for n in range(3)]
    waiting.append(asyncio.create_task(one("unset", None)))
    await asyncio.sleep(0.01)  # they wait for their slots
    waiting.append(asyncio.create_task(one("urgent", 1)))
    await asyncio.gather(*waiting)
    assert order == ["urgent", "unset", "backlog-0", "backlog-1", "backlog-2"]


async def test_a_cancelled_request_gives_its_turn_to_the_next() -> None:
    pacer = RequestPacer({"q": PacedQueue("q", 20.0)})
    for _ in range(5):
        await pacer.acquire("q")
    gone = asyncio.create_task(pacer.acquire("q", 1))
    kept = asyncio.create_task(pacer.acquire("q", 5))
    await asyncio.sleep(0.01)
    gone.cancel()
    await asyncio.wait_for(kept, timeout=1)
    assert gone.cancelled()
