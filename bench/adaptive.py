"""`make bench`'s adaptive-rate figures (or `python -m bench.adaptive`): a provider's hidden limit.

The fake provider admits 20 submits a second to a webhook (a token bucket holding a second's
worth; above it a 429 with `Retry-After: 1`), a limit the destination does not know: it is
configured adaptive (`flowcontrol/adaptive.py`) with a ceiling of 100/s, five times the limit,
and a floor of 2. A producer keeps a backlog of about `BACKLOG` items waiting, so the destination
always has work; bulk mode (one submit per activity), so this machine is not the limit. After
`CONVERGE_S` at 20/s the limit changes to 40/s, then to 10/s, `FOLLOW_S` each. Measured at the
fake provider:

- `adaptive_converged_share`: submits admitted a second over the limit, in the second half of
  the first phase (after convergence; bar: at least 0.85);
- `adaptive_throttled_share`: the share of submits answered 429 then (at most 0.05);
- `adaptive_follow_s`: after each change, the time until a `WINDOW_S` window admits at least
  0.85 of the new limit with at most 5 % answered 429; the longer of the two (at most 30 s);
- `adaptive_lost` and `adaptive_duplicates`: items enqueued and never delivered by the end, and
  delivered twice (0 and 0).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from contextlib import AsyncExitStack
from typing import Any

from durable_outbox_temporal import NewItem

from bench.stack import BenchStack, webhook_stack
from configuration.settings import PROJECT_ROOT
from flowcontrol.queue_rates import read_queue_rate

QUICK = os.environ.get("QUICK") == "1"
LIMITS = (20.0, 40.0, 10.0)
CEILING = 100.0
FLOOR = 2.0
CONVERGE_S = 40.0 if QUICK else 60.0
FOLLOW_S = 40.0
WINDOW_S = 5.0 if QUICK else 10.0
BACKLOG = 150
# The bars (issue 45): what `main` exits non-zero on.
BARS = {"adaptive_converged_share": 0.85, "adaptive_throttled_share": 0.05, "adaptive_follow_s": 30}
NAME = "adaptive"


def _counts(stack: BenchStack, start: float, end: float) -> tuple[int, int]:
    """Submits admitted and refused by the hidden limit in [start, end) (monotonic times)."""
    path = f"/webhook/{NAME}"
    requests = sum(1 for at, p in stack.fake.state.requests if start <= at < end and p == path)
    refused = sum(1 for at, _ in stack.fake.state.hidden_refused if start <= at < end)
    return requests - refused, refused


def _good(stack: BenchStack, start: float, limit: float, window_s: float) -> bool:
    admitted, refused = _counts(stack, start, start + window_s)
    throttled = refused / max(1, admitted + refused)
    return admitted / window_s >= 0.85 * limit and throttled <= 0.05


def _follow_s(stack: BenchStack, changed: float, until: float, limit: float) -> float:
    """Seconds from `changed` to the end of the first good window after it (the phase's length
    when none was)."""
    start = changed
    while start + WINDOW_S <= until:
        if _good(stack, start, limit, WINDOW_S):
            return round(start + WINDOW_S - changed, 1)
        start += 0.5
    return round(until - changed, 1)


async def _produce(stack: BenchStack, keys: list[str], stop: asyncio.Event) -> None:
    """Keep about `BACKLOG` items waiting: enqueue more as the provider admits them."""
    path = f"/webhook/{NAME}"
    while not stop.is_set():
        admitted = sum(1 for _, p in stack.fake.state.requests if p == path) - len(
            stack.fake.state.hidden_refused
        )
        wanted = admitted + BACKLOG - len(keys)
        if wanted > 0:
            batch = [f"{NAME}-{len(keys) + n}" for n in range(min(wanted, 100))]
            items = [stack.outbox.new_item(NAME, NewItem(NAME, {"n": k}, k)) for k in batch]
            await stack.outbox.hand_over(items, strict=True)
            keys += batch
        await asyncio.sleep(0.1)


async def _trace(stack: BenchStack, lines: list[str], stop: asyncio.Event) -> None:
    """Each second: admitted and refused submits, and the rate the server holds the queue to
    (`ADAPTIVE_TRACE=1` prints them: how the rate moved)."""
    began = time.monotonic()
    while not stop.is_set():
        now = time.monotonic()
        admitted, refused = _counts(stack, now - 1, now)
        rate = await read_queue_rate(stack.env.client, stack.destination.submit_task_queue)
        lines.append(
            f"{now - began:6.1f}s admitted {admitted:3} refused {refused:3} rate"
            f" {rate.rate:6.2f} {'paused' if rate.paused else ''}"
        )
        await asyncio.sleep(1)


async def adaptive_figures() -> dict[str, Any]:
    async with AsyncExitStack() as exits:
        stack = await webhook_stack(
            exits,
            name=NAME,
            db_file=PROJECT_ROOT / ".bench" / f"{NAME}.db",
            workflow_task_queue=f"{NAME}-workflows",
            mode="bulk",
            shards=4,
            submit_rate=CEILING,
            poll_rate=2 * CEILING,
            max_attempts=100,
            backoff_initial_s=0.5,
            flow={"adaptive": True, "adaptive_floor": FLOOR, "adaptive_interval_s": 1.0},
        )
        admin = stack.fake.admin
        await admin.set_hidden_limit(NAME, LIMITS[0])
        keys: list[str] = []
        stop = asyncio.Event()
        producer = asyncio.create_task(_produce(stack, keys, stop))
        trace: list[str] = []
        tracer = asyncio.create_task(_trace(stack, trace, stop))
        began = time.monotonic()
        await asyncio.sleep(CONVERGE_S)
        converged_end = time.monotonic()
        # After convergence: the second half of the phase.
        admitted, refused = _counts(stack, converged_end - CONVERGE_S / 2, converged_end)
        follows = []
        for limit in LIMITS[1:]:
            await admin.set_hidden_limit(NAME, limit)
            changed = time.monotonic()
            await asyncio.sleep(FOLLOW_S)
            follows.append(_follow_s(stack, changed, time.monotonic(), limit))
            print(f"  limit {limit:g}/s: settled after {follows[-1]} s", flush=True)
        stop.set()
        await producer
        await tracer
        if os.environ.get("ADAPTIVE_TRACE") == "1":
            print("\n".join(trace))
        # Drain what waits at the last limit, then count.
        await admin.clear_hidden_limit(NAME)
        deadline = time.monotonic() + 120
        totals: dict[str, Any] = {}
        while time.monotonic() < deadline:
            totals = (await admin.stats())["totals"]
            if totals["deliveries"] >= len(keys):
                break
            await asyncio.sleep(0.5)
        took = time.monotonic() - began
    return {
        "adaptive_converged_share": round(admitted / (CONVERGE_S / 2) / LIMITS[0], 3),
        "adaptive_throttled_share": round(refused / max(1, admitted + refused), 3),
        "adaptive_follow_s": max(follows),
        "adaptive_follow_up_s": follows[0],
        "adaptive_follow_down_s": follows[1],
        "adaptive_items": len(keys),
        "adaptive_lost": max(0, len(keys) - totals.get("deliveries", 0)),
        "adaptive_duplicates": totals.get("duplicates", 0),
        "adaptive_s": round(took, 1),
    }


def failures(figures: dict[str, Any]) -> list[str]:
    """The bars `figures` miss, in words."""
    problems = []
    if figures["adaptive_converged_share"] < BARS["adaptive_converged_share"]:
        problems.append("adaptive_converged_share under 0.85")
    if figures["adaptive_throttled_share"] > BARS["adaptive_throttled_share"]:
        problems.append("adaptive_throttled_share over 0.05")
    if figures["adaptive_follow_s"] > BARS["adaptive_follow_s"]:
        problems.append("adaptive_follow_s over 30 s")
    if figures["adaptive_lost"] or figures["adaptive_duplicates"]:
        problems.append("items lost or sent twice")
    return problems


def main() -> int:
    figures = asyncio.run(adaptive_figures())
    print(json.dumps(figures, indent=2))
    problems = failures(figures)
    for problem in problems:
        print("FAIL:", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
