"""`python -m bench.fairness` (QUICK=1 for a shorter backlog): fairness between outboxes.

One webhook destination at FAIRNESS_RATE submits/s (10). Outbox `big` enqueues FAIRNESS_BACKLOG
items (300; 150 with QUICK=1); once they are draining, three other outboxes enqueue one item
each. Measured at the fake provider: how long those items took from enqueue to delivery, and how
many of the big backlog went before them. Run twice, each on its own in-memory dev server: with
the task queue fairness this project turns on (`devstack.temporal_server`), and without it (first
come, first served). Same product, same workflow (its submits always carry the outbox as
fairness key). Prints a table and writes `.bench/fairness.json`.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from durable_outbox_temporal.contract.ids import provider_idempotency_key

from bench.run import machine
from bench.stack import webhook_stack
from configuration.settings import PROJECT_ROOT
from devstack.fake_provider import FakeProvider

QUICK = os.environ.get("QUICK") == "1"
RATE = float(os.environ.get("FAIRNESS_RATE") or 10)
BACKLOG = int(os.environ.get("FAIRNESS_BACKLOG") or (150 if QUICK else 300))
SMALL_OUTBOXES = ("small-1", "small-2", "small-3")
# The small items arrive once this many of the backlog have been delivered (it is draining).
DRAINING_AFTER = 20
RESULT = PROJECT_ROOT / ".bench" / "fairness.json"
WORKFLOWS = "fairness-workflows"
# The one webhook destination every outbox shares, and its endpoint at the fake.
ENDPOINT = "shared-webhook"


async def delivered(fake: FakeProvider, at_least: int, timeout_s: float) -> list[dict[str, Any]]:
    """The fake's deliveries to the shared endpoint, in arrival order, once there are enough."""
    deadline = time.monotonic() + timeout_s
    while True:
        log = await fake.admin.deliveries(ENDPOINT)
        if len(log) >= at_least:
            return log
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(log)} of {at_least} delivered after {timeout_s:.0f} s")
        await asyncio.sleep(0.05)


async def measure(fairness: bool, data_dir: Path) -> dict[str, Any]:
    """One run on a fresh dev server; returns the small outboxes' latency and place in line."""
    async with AsyncExitStack() as exits:
        stack = await webhook_stack(
            exits,
            name=ENDPOINT,
            db_file=data_dir / f"fairness-{fairness}.db",
            workflow_task_queue=WORKFLOWS,
            fairness=fairness,
            submit_rate=RATE,
            report_window_s=0,
        )
        fake, destination, outbox = stack.fake, stack.destination, stack.outbox
        began = time.time()
        await asyncio.gather(
            *(
                outbox.enqueue("big", destination.name, {"n": n}, key=f"b{n}")
                for n in range(BACKLOG)
            )
        )
        await delivered(fake, DRAINING_AFTER, timeout_s=60)
        small_at = time.time()
        small = await asyncio.gather(
            *(outbox.enqueue(name, destination.name, {"n": 0}, key="s0") for name in SMALL_OUTBOXES)
        )
        keys = {provider_idempotency_key(item.item_id) for item in small}
        log = await delivered(fake, BACKLOG + len(small), timeout_s=BACKLOG / RATE * 3 + 60)
    positions = [index for index, entry in enumerate(log) if entry["key"] in keys]
    latencies = [log[index]["at"] - small_at for index in positions]
    return {
        "fairness": fairness,
        "small_latency_max_s": round(max(latencies), 2),
        "small_latency_min_s": round(min(latencies), 2),
        # Big items delivered between the small ones' enqueue and the last small one's delivery.
        "big_before_small_max": sum(
            1
            for entry in log[: max(positions)]
            if entry["key"] not in keys and entry["at"] >= small_at
        ),
        "big_left_behind_min": len(log) - 1 - max(positions),
        "backlog_drained_s": round(log[-1]["at"] - began, 1),
    }


async def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        with_fairness = await measure(True, Path(scratch))
        print(f"  with fairness: {with_fairness}", flush=True)
        without = await measure(False, Path(scratch))
        print(f"  without fairness: {without}", flush=True)
    return {
        **machine(),
        "mode": "quick" if QUICK else "full",
        "rate_per_s": RATE,
        "backlog": BACKLOG,
        "small_outboxes": len(SMALL_OUTBOXES),
        "with_fairness": with_fairness,
        "without_fairness": without,
    }


def main() -> int:
    print(f"fairness: backlog {BACKLOG} at {RATE:g}/s, then {len(SMALL_OUTBOXES)} small outboxes")
    report = asyncio.run(run())
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(report, indent=2) + "\n")
    print("\n| metric | with fairness | without |\n|---|---|---|")
    for key in report["with_fairness"]:
        if key != "fairness":
            print(f"| {key} | {report['with_fairness'][key]} | {report['without_fairness'][key]} |")
    print(f"\nwritten to {RESULT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
