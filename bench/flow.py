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
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from contextlib import AsyncExitStack
from typing import Any

from sqlalchemy import func, select

from bench.stack import BenchStack, webhook_stack
from common.settings import PROJECT_ROOT
from readmodel.models import ITEMS

ITEMS_IN_STORM = 40
STORM_S = 14.0
RETRY_AFTER = "4"
RATE = 5.0
ROUNDS = 2
# A run is given up when nothing is delivered for this long.
STALL_S = 120.0


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
            stack.outbox.new_item("storm", name, {"n": n}, key=f"{name}-{n}")
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


async def flow_figures() -> dict[str, Any]:
    on: list[dict[str, float]] = []
    off: list[dict[str, float]] = []
    for round_ in range(ROUNDS):
        on.append(await storm(True, round_))
        off.append(await storm(False, round_))
        print(f"  round {round_}: pause {on[-1]}, items alone {off[-1]}", flush=True)
    return {
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
    return 0 if figures["storm_duplicates"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
