"""`make bench`'s ordered-delivery figures (or `python -m bench.lanes`): one key under load.

Each mode gets a stack of its own (`bench.stack`: a dev server, the fake provider, the workers)
with a fast webhook destination (rate 1,000/s, so the destination is never the limit):

- `lane_items_per_s`: 1,000 items into ONE lane, item mode with runs (`lane_run = LANE_RUN`,
  held to the rate by a quota of 1,000 per second, as the destination's config must), from the
  first enqueue to the last delivery (appended together from one process, as a busy service
  would);
- `lane_items_per_s_single`: the same without runs (`lane_run = 1`, the default: one submit
  activity and one workflow task per item);
- `bulk_lane_items_per_s`: the same in bulk mode (batches of 100, as `items:batch` sends them);
- `lanes_items_per_s`: many keys x 5 items in bulk mode, beside `bulk_unordered_items_per_s`,
  the same number of items without keys on the same stack, in three alternating rounds
  (medians; each round's ratio in `lanes_ratio_by_round`);
- `lane_append_p50_ms` / `lane_append_p99_ms`: 20 appenders into one item-mode lane, each
  appending one item after another;
- `ordered_producer_items_per_s`: one producer, one key, `PRODUCER_ITEMS` items into an item-mode
  lane through the Temporal client (`OutboxClient.enqueue`), each enqueue awaited before the next
  (the way to keep order from one process), from the first enqueue to the last delivery;
  `ordered_producer_runs_items_per_s`: the same into a lane with runs (`lane_run` and the quota
  it needs), where the items that wait while the head is sent go together in one submit;
  `bulk_ordered_producer_items_per_s`: the same in bulk mode, where each enqueue is answered once
  the server has recorded its signal to the key's shard (no worker in the answer's path).

Every run also checks at the fake provider that each key's items arrived once each and in
order; `problems` lists any that did not.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from contextlib import AsyncExitStack
from typing import Any

from durable_outbox_temporal import NewItem
from sqlalchemy import func, select

from bench.hot_aggregate import percentile
from bench.stack import BenchStack, webhook_stack
from configuration.settings import PROJECT_ROOT
from readmodel.models import ITEMS

QUICK = os.environ.get("QUICK") == "1"
LANE_ITEMS = 1_000
KEYS = 200 if QUICK else 1_000
PER_KEY = 5
APPENDERS = 20
# Alternating rounds of unordered and keyed items in bulk mode (each round's outboxes its own).
ROUNDS = 3
APPENDS_EACH = 10 if QUICK else 25
PRODUCER_ITEMS = 400
BATCH = 100
# A run is given up when nothing is delivered for this long.
STALL_S = 60.0
# Items one submit activity of an item-mode lane carries in the runs configuration, and the
# quota that lets it (at most the destination's rate: `durable_outbox_temporal.destinations`).
LANE_RUN = 20
RATE = 1000
RUNS_IN_ITEM_MODE = {"lane_run": LANE_RUN, "flow": {"quotas": [{"per": "1s", "max": RATE}]}}


async def delivered(stack: BenchStack, outbox: str, expected: int) -> float:
    """Wait until the read model has `expected` of the outbox's items sent; when that was."""
    done, progressed_at = 0, time.monotonic()
    while True:
        with stack.engine.connect() as connection:
            sent = connection.execute(
                select(func.count())
                .select_from(ITEMS)
                .where(ITEMS.c.outbox == outbox, ITEMS.c.status == "sent")
            ).scalar_one()
        if sent >= expected:
            return time.monotonic()
        if sent > done:
            done, progressed_at = sent, time.monotonic()
        if time.monotonic() - progressed_at > STALL_S:
            raise TimeoutError(f"{outbox}: stalled at {done} of {expected} sent")
        await asyncio.sleep(0.1)


async def order_problems(stack: BenchStack, outbox: str, expected: int) -> list[str]:
    """Each key's items at the fake: once each, in the order they were enqueued."""
    arrivals = [
        entry["payload"]
        for entry in await stack.fake.admin.deliveries(stack.destination.name)
        if entry["payload"].get("outbox") == outbox
    ]
    seen: dict[tuple[str, int], int] = {}
    last: dict[str, int] = {}
    out_of_order = 0
    for payload in arrivals:
        mark = (payload["key"], payload["n"])
        seen[mark] = seen.get(mark, 0) + 1
        if payload["n"] < last.get(payload["key"], -1):
            out_of_order += 1
        last[payload["key"]] = payload["n"]
    problems = []
    if len(seen) != expected:
        problems.append(f"{outbox}: {expected - len(seen)} items lost")
    if duplicates := sum(count - 1 for count in seen.values()):
        problems.append(f"{outbox}: {duplicates} delivered twice")
    if out_of_order:
        problems.append(f"{outbox}: {out_of_order} arrived before an item enqueued earlier")
    return problems


async def one_lane(stack: BenchStack, outbox: str, batched: bool) -> tuple[float, list[str]]:
    """Items per second through one lane, first enqueue to last delivery."""
    name = stack.destination.name
    items = [({"outbox": outbox, "key": "one", "n": n}, f"{outbox}-{n}") for n in range(LANE_ITEMS)]
    began = time.monotonic()
    if batched:
        for start in range(0, LANE_ITEMS, BATCH):
            built = [
                stack.outbox.new_item(outbox, NewItem(name, payload, key, ordering_key="one"))
                for payload, key in items[start : start + BATCH]
            ]
            await stack.outbox.hand_over(built, strict=True)
    else:
        await asyncio.gather(
            *(
                stack.outbox.enqueue(outbox, name, payload, key=key, ordering_key="one")
                for payload, key in items
            )
        )
    ended = await delivered(stack, outbox, LANE_ITEMS)
    return LANE_ITEMS / (ended - began), await order_problems(stack, outbox, LANE_ITEMS)


async def many_keys(stack: BenchStack, outbox: str, keyed: bool) -> tuple[float, list[str]]:
    """Items per second for KEYS x PER_KEY items in batches, with or without ordering keys."""
    name = stack.destination.name
    built = [
        stack.outbox.new_item(
            outbox,
            NewItem(
                name,
                {"outbox": outbox, "key": f"k{k}", "n": n},
                f"{outbox}-{k}-{n}",
                ordering_key=f"k{k}" if keyed else None,
            ),
        )
        for n in range(PER_KEY)
        for k in range(KEYS)
    ]
    began = time.monotonic()
    for start in range(0, len(built), BATCH):
        await stack.outbox.hand_over(built[start : start + BATCH], strict=True)
    ended = await delivered(stack, outbox, len(built))
    problems = await order_problems(stack, outbox, len(built)) if keyed else []
    return len(built) / (ended - began), problems


async def append_latency(stack: BenchStack, outbox: str) -> tuple[list[float], list[str]]:
    """20 appenders into one lane, each appending one item after another: each call's time."""
    name = stack.destination.name
    latencies: list[float] = []

    async def appender(a: int) -> None:
        for n in range(APPENDS_EACH):
            began = time.perf_counter()
            await stack.outbox.enqueue(
                outbox,
                name,
                {"outbox": outbox, "key": f"a{a}", "n": n},
                key=f"{outbox}-{a}-{n}",
                ordering_key="shared",
            )
            latencies.append((time.perf_counter() - began) * 1000)

    await asyncio.gather(*(appender(a) for a in range(APPENDERS)))
    expected = APPENDERS * APPENDS_EACH
    await delivered(stack, outbox, expected)
    return latencies, await order_problems(stack, outbox, expected)


async def ordered_producer(stack: BenchStack, outbox: str) -> tuple[float, list[str]]:
    """One producer, one key: each enqueue awaited before the next; items a second, first
    enqueue to last delivery."""
    name = stack.destination.name
    began = time.monotonic()
    for n in range(PRODUCER_ITEMS):
        await stack.outbox.enqueue(
            outbox,
            name,
            {"outbox": outbox, "key": "producer", "n": n},
            key=f"{outbox}-{n}",
            ordering_key="producer",
        )
    ended = await delivered(stack, outbox, PRODUCER_ITEMS)
    return PRODUCER_ITEMS / (ended - began), await order_problems(stack, outbox, PRODUCER_ITEMS)


async def lanes_figures() -> dict[str, Any]:
    figures: dict[str, Any] = {}
    problems: list[str] = []
    for mode in ("item", "item-runs", "bulk"):
        async with AsyncExitStack() as exits:
            extra: dict[str, Any] = {
                "item": {},
                "item-runs": RUNS_IN_ITEM_MODE,
                "bulk": {"mode": "bulk", "shards": 4, "submit_batch": 100},
            }[mode]
            stack = await webhook_stack(
                exits,
                name=f"lanes-{mode}",
                db_file=PROJECT_ROOT / ".bench" / f"lanes_{mode}.db",
                workflow_task_queue=f"lanes-{mode}-workflows",
                submit_rate=RATE,
                poll_rate=RATE,
                **extra,
            )
            if mode == "item":
                rate, found = await one_lane(stack, "one-lane-item", batched=False)
                figures["lane_items_per_s_single"] = round(rate, 1)
                latencies, more = await append_latency(stack, "appenders")
                figures["lane_append_p50_ms"] = round(percentile(latencies, 0.5), 1)
                figures["lane_append_p99_ms"] = round(percentile(latencies, 0.99), 1)
                producer_rate, in_order = await ordered_producer(stack, "producer")
                figures["ordered_producer_items_per_s"] = round(producer_rate, 1)
                problems += found + more + in_order
            elif mode == "item-runs":
                rate, found = await one_lane(stack, "one-lane-item-runs", batched=False)
                figures["lane_items_per_s"] = round(rate, 1)
                producer_rate, in_order = await ordered_producer(stack, "producer-runs")
                figures["ordered_producer_runs_items_per_s"] = round(producer_rate, 1)
                problems += found + in_order
            else:
                rate, found = await one_lane(stack, "one-lane-bulk", batched=True)
                figures["bulk_lane_items_per_s"] = round(rate, 1)
                producer_rate, in_order = await ordered_producer(stack, "producer-bulk")
                figures["bulk_ordered_producer_items_per_s"] = round(producer_rate, 1)
                problems += found + in_order
                # Alternating rounds on the same stack: one of each gives a ratio that moves
                # with whichever ran when the machine was busier (docs/decisions/
                # bench-alternating-rounds.md).
                unordered_rates, keyed_rates = [], []
                for round_ in range(ROUNDS):
                    unordered, _ = await many_keys(stack, f"unordered-{round_}", keyed=False)
                    keyed, more = await many_keys(stack, f"keyed-{round_}", keyed=True)
                    unordered_rates.append(unordered)
                    keyed_rates.append(keyed)
                    problems += more
                figures["bulk_unordered_items_per_s"] = round(statistics.median(unordered_rates), 1)
                figures["lanes_items_per_s"] = round(statistics.median(keyed_rates), 1)
                figures["lanes_ratio_vs_unordered"] = round(
                    figures["lanes_items_per_s"] / figures["bulk_unordered_items_per_s"], 3
                )
                figures["lanes_ratio_by_round"] = [
                    round(k / u, 3) for k, u in zip(keyed_rates, unordered_rates, strict=True)
                ]
        print(f"  {mode} mode: {json.dumps(figures)}", flush=True)
    figures["lanes_problems"] = problems
    return figures


def main() -> int:
    figures = asyncio.run(lanes_figures())
    print(json.dumps(figures, indent=2))
    return 1 if figures["lanes_problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
