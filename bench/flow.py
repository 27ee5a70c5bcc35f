"""`make bench`'s flow-control figures (or `python -m bench.flow`): a throttle storm.

A 5/s webhook answers every request 429 with `Retry-After: 4` for 14 s while 40 items wait (the
storm the flow-control issue measured at 111 submits). Counted at the fake provider, from the
first enqueue until every item is sent, with the destination's throttle rule on (a 429 pauses
the whole submit queue, `flowcontrol/throttle.py`) and off (each item waits its own
Retry-After), in alternating rounds, each round a stack of its own:

- `storm_submits_per_item`: submits per item with the rule on (median of the rounds);
- `storm_submits_per_item_without_pause`: the same with it off;
- `storm_early_requests`: requests the fake saw before a Retry-After it gave had elapsed (0);
- `storm_s`: seconds from the first enqueue to the last item sent, rule on.

And priorities (`durable_outbox_temporal/contract/priority.py`): a bulk destination at 50/s gets a
backlog of 2,000 priority-5 items (500 with `QUICK=1`), then, once it drains, 50 priority-1 items;
each item's wait is from its hand-over to its arrival at the fake provider:

- `priority_high_wait_median_s` / `priority_low_wait_median_s`, and their ratio
  `priority_wait_ratio` (bar: at most 0.1).

And caps and quotas (`flowcontrol/caps.py`): 60 items of three tenants (30, 20, 10) to a
webhook answering in 200 ms, with `max_in_flight = 4`, `key_max_in_flight = 2` and
`key_quotas = [{per = "1s", max = 5}]`, and without them, in alternating rounds; measured at
the fake provider:

- `cap_max_in_flight` / `cap_max_in_flight_without`: the most requests out at once;
- `cap_key_max_in_flight` / `..._without`: the most of one tenant's out at once;
- `quota_key_max_per_s` / `..._without`: the most of one tenant's in any second;
- `caps_items_per_s` / `..._without`: items sent a second, first enqueue to last sent.

And debounce (`durable_outbox_temporal/contract/debounce_rules.py`): 20 keys, 25 enqueues each from
20 concurrent callers (`debounce_s` 1, mode `latest`), to a webhook at 100/s; counted at the fake
provider:

- `debounce_deliveries_per_key`: deliveries per key (1: every window became one delivery);
- `debounce_last_payload_share`: the share of keys whose delivery carried their last payload;
- `debounce_enqueue_p50_ms` / `debounce_enqueue_p99_ms`: each enqueue's confirmation (the
  window holds it), with 20 callers joining windows at once.
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

from bench.stack import BenchStack, webhook_stack
from configuration.settings import PROJECT_ROOT
from readmodel.models import ITEMS

ITEMS_IN_STORM = 40
STORM_S = 14.0
RETRY_AFTER = "4"
RATE = 5.0
ROUNDS = 2
# A run is given up when nothing is delivered for this long.
STALL_S = 120.0
QUICK = os.environ.get("QUICK") == "1"
PRIORITY_LOW = 500 if QUICK else 2_000
PRIORITY_HIGH = 50
PRIORITY_RATE = 50.0
CAP_TENANTS = {"a": 30, "b": 20, "c": 10}
CAP_FLOW = {"max_in_flight": 4, "key_max_in_flight": 2, "key_quotas": [{"per": "1s", "max": 5}]}
CAP_LATENCY_MS = 200
DEBOUNCE_KEYS = 20
DEBOUNCE_PER_KEY = 25
DEBOUNCE_CALLERS = 20


async def sent(stack: BenchStack, outbox: str) -> int:
    with stack.engine.connect() as connection:
        return int(
            connection.execute(
                select(func.count())
                .select_from(ITEMS)
                .where(ITEMS.c.outbox == outbox, ITEMS.c.status == "sent")
            ).scalar_one()
        )


async def storm(pause: bool, round_: int) -> dict[str, float]:
    """One storm on a fresh stack; its counts at the fake provider."""
    name = f"storm-{'pause' if pause else 'items'}-{round_}"
    async with AsyncExitStack() as exits:
        stack = await webhook_stack(
            exits,
            name=name,
            db_file=PROJECT_ROOT / ".bench" / f"{name}.db",
            workflow_task_queue=f"{name}-workflows",
            submit_rate=RATE,
            max_attempts=50,
            flow={"throttle_pause": pause},
        )
        await stack.fake.admin.set_endpoint_fault(name, status=429, retry_after=RETRY_AFTER)
        items = [
            stack.outbox.new_item("storm", NewItem(name, {"n": n}, f"{name}-{n}"))
            for n in range(ITEMS_IN_STORM)
        ]
        began = time.monotonic()
        await stack.outbox.hand_over(items, strict=True)
        await asyncio.sleep(STORM_S)
        await stack.fake.admin.clear_endpoint_fault(name)
        done, progressed_at = 0, time.monotonic()
        while done < ITEMS_IN_STORM:
            now_done = await sent(stack, "storm")
            if now_done > done:
                done, progressed_at = now_done, time.monotonic()
            if time.monotonic() - progressed_at > STALL_S:
                raise RuntimeError(f"{name}: {done} of {ITEMS_IN_STORM} sent, then nothing")
            await asyncio.sleep(0.2)
        took = time.monotonic() - began
        totals = (await stack.fake.admin.stats())["totals"]
    return {
        "submits_per_item": totals["submits"] / ITEMS_IN_STORM,
        "early_requests": totals["early_requests"],
        "duplicates": totals["duplicates"],
        "seconds": took,
    }


async def priorities() -> dict[str, float]:
    """Waits of urgent items behind a backlog, against the backlog's own."""
    name = "priorities"
    async with AsyncExitStack() as exits:
        stack = await webhook_stack(
            exits,
            name=name,
            db_file=PROJECT_ROOT / ".bench" / f"{name}.db",
            workflow_task_queue=f"{name}-workflows",
            submit_rate=PRIORITY_RATE,
            mode="bulk",
        )

        def build(n: int, priority: int) -> Any:
            payload = {"n": n, "p": priority}
            key = f"{name}-{priority}-{n}"
            return stack.outbox.new_item("prio", NewItem(name, payload, key, priority=priority))

        low_at = time.time()
        for start in range(0, PRIORITY_LOW, 100):
            batch = [build(n, 5) for n in range(start, min(start + 100, PRIORITY_LOW))]
            await stack.outbox.hand_over(batch, strict=True)
        for _ in range(int(STALL_S * 10)):  # until a second's worth is out: it is draining
            if len(await stack.fake.admin.deliveries(name)) >= PRIORITY_RATE:
                break
            await asyncio.sleep(0.1)
        high_at = time.time()
        await stack.outbox.hand_over([build(n, 1) for n in range(PRIORITY_HIGH)], strict=True)
        total, progressed_at, seen = PRIORITY_LOW + PRIORITY_HIGH, time.monotonic(), 0
        while (entries := await stack.fake.admin.deliveries(name)) and len(entries) < total:
            if len(entries) > seen:
                seen, progressed_at = len(entries), time.monotonic()
            if time.monotonic() - progressed_at > STALL_S:
                raise RuntimeError(f"{name}: {seen} of {total} sent, then nothing")
            await asyncio.sleep(0.2)
    high = [e["at"] - high_at for e in entries if e["payload"]["p"] == 1]
    low = [e["at"] - low_at for e in entries if e["payload"]["p"] == 5]
    high_median, low_median = statistics.median(high), statistics.median(low)
    return {
        "priority_high_wait_median_s": round(high_median, 2),
        "priority_low_wait_median_s": round(low_median, 2),
        "priority_wait_ratio": round(high_median / low_median, 3),
    }


async def caps(on: bool, round_: int) -> dict[str, float]:
    """One run of the tenants' items, with the caps and quotas on or off."""
    name = f"caps-{'on' if on else 'off'}-{round_}"
    async with AsyncExitStack() as exits:
        stack = await webhook_stack(
            exits,
            name=name,
            db_file=PROJECT_ROOT / ".bench" / f"{name}.db",
            workflow_task_queue=f"{name}-workflows",
            submit_rate=100.0,
            flow=CAP_FLOW if on else {},
        )
        await stack.fake.admin.set_endpoint_fault(name, latency_ms=CAP_LATENCY_MS)
        items = [
            stack.outbox.new_item(
                "caps",
                NewItem(
                    name,
                    {"tenant": tenant, "n": n},
                    f"{name}-{tenant}-{n}",
                    concurrency_key=tenant,
                ),
            )
            for tenant, count in CAP_TENANTS.items()
            for n in range(count)
        ]
        began = time.monotonic()
        await stack.outbox.hand_over(items, strict=True)
        done, progressed_at = 0, time.monotonic()
        while done < len(items):
            now_done = await sent(stack, "caps")
            if now_done > done:
                done, progressed_at = now_done, time.monotonic()
            if time.monotonic() - progressed_at > STALL_S:
                raise RuntimeError(f"{name}: {done} of {len(items)} sent, then nothing")
            await asyncio.sleep(0.1)
        took = time.monotonic() - began
        prefix, admin = f"/webhook/{name}", stack.fake.admin
        per_key = [await admin.max_in_flight(prefix, {"tenant": t}) for t in CAP_TENANTS]
        per_s = [await admin.max_rate(prefix, 1.0, {"tenant": t}) for t in CAP_TENANTS]
        return {
            "max_in_flight": await admin.max_in_flight(prefix),
            "key_max_in_flight": max(per_key),
            "key_max_per_s": max(per_s),
            "items_per_s": len(items) / took,
        }


async def cap_figures() -> dict[str, Any]:
    on: list[dict[str, float]] = []
    off: list[dict[str, float]] = []
    for round_ in range(ROUNDS):
        on.append(await caps(True, round_))
        off.append(await caps(False, round_))
        print(f"  caps round {round_}: on {on[-1]}, off {off[-1]}", flush=True)
    figures: dict[str, Any] = {}
    for figure, name in (
        ("max_in_flight", "cap_max_in_flight"),
        ("key_max_in_flight", "cap_key_max_in_flight"),
        ("key_max_per_s", "quota_key_max_per_s"),
    ):
        # The most any round saw: a cap holds in every round or not at all.
        figures[name] = max(r[figure] for r in on)
        figures[f"{name}_without"] = max(r[figure] for r in off)
    figures["caps_items_per_s"] = round(statistics.median(r["items_per_s"] for r in on), 1)
    figures["caps_items_per_s_without"] = round(statistics.median(r["items_per_s"] for r in off), 1)
    return figures


async def debounce() -> dict[str, float]:
    """Bursts of enqueues per debounce key: one delivery each, and what a join costs."""
    name = "debounce"
    async with AsyncExitStack() as exits:
        stack = await webhook_stack(
            exits,
            name=name,
            db_file=PROJECT_ROOT / ".bench" / f"{name}.db",
            workflow_task_queue=f"{name}-workflows",
            submit_rate=100.0,
        )
        # Each key's enqueues in order (n rising), keys interleaved across the callers.
        todo = [(n, key) for n in range(DEBOUNCE_PER_KEY) for key in range(DEBOUNCE_KEYS)]
        latencies: list[float] = []

        async def caller(share: list[tuple[int, int]]) -> None:
            for n, key in share:
                began = time.monotonic()
                await stack.outbox.enqueue(
                    "debounce",
                    name,
                    {"key": key, "n": n},
                    key=f"k{key}-{n}",
                    debounce_key=f"k{key}",
                    debounce_s=1.0,
                )
                latencies.append((time.monotonic() - began) * 1000)

        shares = [todo[i::DEBOUNCE_CALLERS] for i in range(DEBOUNCE_CALLERS)]
        await asyncio.gather(*(caller(share) for share in shares))
        deadline = time.monotonic() + STALL_S
        delivered: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            delivered = await stack.fake.admin.deliveries(name)
            if len({d["payload"]["key"] for d in delivered}) == DEBOUNCE_KEYS:
                await asyncio.sleep(2)  # any second delivery of a key would show by now
                delivered = await stack.fake.admin.deliveries(name)
                break
            await asyncio.sleep(0.2)
    last = {d["payload"]["key"] for d in delivered if d["payload"]["n"] == DEBOUNCE_PER_KEY - 1}
    latencies.sort()
    return {
        "debounce_deliveries_per_key": round(len(delivered) / DEBOUNCE_KEYS, 3),
        "debounce_last_payload_share": round(len(last) / DEBOUNCE_KEYS, 3),
        "debounce_enqueue_p50_ms": round(latencies[len(latencies) // 2], 1),
        "debounce_enqueue_p99_ms": round(latencies[int(len(latencies) * 0.99) - 1], 1),
    }


async def flow_figures() -> dict[str, Any]:
    on: list[dict[str, float]] = []
    off: list[dict[str, float]] = []
    for round_ in range(ROUNDS):
        on.append(await storm(True, round_))
        off.append(await storm(False, round_))
        print(f"  round {round_}: pause {on[-1]}, items alone {off[-1]}", flush=True)
    waits = await priorities()
    print(f"  priorities: {waits}", flush=True)
    capped = await cap_figures()
    debounced = await debounce()
    print(f"  debounce: {debounced}", flush=True)
    return {
        **waits,
        **capped,
        **debounced,
        "storm_submits_per_item": round(statistics.median(r["submits_per_item"] for r in on), 3),
        "storm_submits_per_item_without_pause": round(
            statistics.median(r["submits_per_item"] for r in off), 3
        ),
        "storm_early_requests": int(sum(r["early_requests"] for r in on + off)),
        "storm_duplicates": int(sum(r["duplicates"] for r in on + off)),
        "storm_s": round(statistics.median(r["seconds"] for r in on), 1),
    }


def main() -> int:
    figures = asyncio.run(flow_figures())
    print(json.dumps(figures, indent=2))
    held = (
        figures["cap_max_in_flight"] <= CAP_FLOW["max_in_flight"]
        and figures["cap_key_max_in_flight"] <= CAP_FLOW["key_max_in_flight"]
        and figures["quota_key_max_per_s"] <= 5
        and figures["debounce_deliveries_per_key"] == 1
    )
    return 0 if figures["storm_duplicates"] == 0 and held else 1


if __name__ == "__main__":
    sys.exit(main())
