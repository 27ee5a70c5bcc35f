"""`make chaos` part two (or `python -m bench.lane_scale`): 10,000 items in ONE ordering lane.

Starts its own dev server (in-memory), the fake provider and the workers in this process.
LANE_APPENDERS concurrent clients append LANE_ITEMS items (10,000; 1,000 with QUICK=1) to one
lane, each client its own numbered sequence, while the provider fails 5% of submits with a 503.
The lane continues as new many times on the way. Then, at the fake provider: every item arrived
exactly once, and each client's items arrived in the order that client appended them (a client
waits for each append before the next, so its items are ordered in the lane's history). Prints a
table, writes `.bench/lane_scale.json`, and exits 1 on any loss, duplicate or reordering, or
if the lane stops moving for LANE_STALL_S (120 s). A lane delivers one item at a time (each item
costs two lane workflow tasks, a child start and the child's own run), so the full run is long;
its latest figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from contextlib import AsyncExitStack
from typing import Any

from temporalio.client import Client

from bench.run import machine
from bench.stack import webhook_stack
from bench.verdict import verdict
from common.settings import PROJECT_ROOT
from contract.ids import lane_workflow_id
from devstack.fake_provider import FaultConfig
from outbox_client import OutboxClient
from readmodel.lanes import get_lane

QUICK = os.environ.get("QUICK") == "1"
ITEMS = int(os.environ.get("LANE_ITEMS") or (1_000 if QUICK else 10_000))
APPENDERS = int(os.environ.get("LANE_APPENDERS") or 20)
# The run fails if no item of the lane ends for this long.
STALL_S = float(os.environ.get("LANE_STALL_S") or 120)
OUTBOX = "lane-scale"
LANE = "one-lane"
RESULT = PROJECT_ROOT / ".bench" / "lane_scale.json"


async def append_all(outbox: OutboxClient, destination: str) -> float:
    """Each appender sends its own numbered sequence, one append after another."""
    per_appender = ITEMS // APPENDERS

    async def appender(a: int) -> None:
        for i in range(per_appender):
            await outbox.enqueue(
                OUTBOX,
                destination,
                {"appender": a, "i": i},
                key=f"a{a}-{i}",
                ordering_key=LANE,
            )

    began = time.monotonic()
    await asyncio.gather(*(appender(a) for a in range(APPENDERS)))
    return time.monotonic() - began


async def lane_runs(client: Client) -> int:
    """How many runs the lane has had (each continue-as-new starts one)."""
    query = f"WorkflowId = '{lane_workflow_id(OUTBOX, LANE)}'"
    return len([execution async for execution in client.list_workflows(query)])


async def run() -> tuple[dict[str, Any], list[str]]:
    problems: list[str] = []
    async with AsyncExitStack() as exits:
        stack = await webhook_stack(
            exits,
            name="lane-webhook",
            db_file=PROJECT_ROOT / ".bench" / "lane_scale.db",
            workflow_task_queue="lane-scale-workflows",
            faults=FaultConfig(error_rate=0.05, seed=7),
            submit_rate=1000,
            backoff_initial_s=0.2,
            backoff_max_s=1,
        )
        env, fake, engine, destination, outbox = (
            stack.env,
            stack.fake,
            stack.engine,
            stack.destination,
            stack.outbox,
        )
        began = time.monotonic()
        append_s = await append_all(outbox, destination.name)
        expected = (ITEMS // APPENDERS) * APPENDERS
        done, progressed_at = 0, time.monotonic()
        while True:
            lane = get_lane(engine, OUTBOX, LANE)
            ended = lane.sent + lane.failed + lane.cancelled if lane is not None else 0
            if ended >= expected:
                break
            if ended > done:
                done, progressed_at = ended, time.monotonic()
            # One lane goes at its own pace (one item at a time): the run fails when the lane
            # stops moving, not after a fixed time.
            if time.monotonic() - progressed_at > STALL_S:
                problems.append(f"stalled {STALL_S:g}s at {done} of {expected} ended")
                break
            await asyncio.sleep(1)
        elapsed = time.monotonic() - began
        arrivals = [entry["payload"] for entry in await fake.admin.deliveries("lane-webhook")]
        runs = await lane_runs(env.client)
    seen: dict[tuple[int, int], int] = {}
    for payload in arrivals:
        seen[(payload["appender"], payload["i"])] = (
            seen.get((payload["appender"], payload["i"]), 0) + 1
        )
    duplicates = sum(count - 1 for count in seen.values())
    lost = expected - len(seen)
    out_of_order = 0
    last: dict[int, int] = {}
    for payload in arrivals:
        if payload["i"] < last.get(payload["appender"], -1):
            out_of_order += 1
        last[payload["appender"]] = payload["i"]
    if lost:
        problems.append(f"{lost} items lost")
    if duplicates:
        problems.append(f"{duplicates} duplicate deliveries")
    if out_of_order:
        problems.append(f"{out_of_order} items arrived before an item appended earlier")
    if runs < 2:
        problems.append("the lane never continued as new")
    report = {
        **machine(),
        "mode": "quick" if QUICK else "full",
        "items": expected,
        "appenders": APPENDERS,
        "append_s": round(append_s, 1),
        "appends_per_s": round(expected / append_s, 1),
        "elapsed_s": round(elapsed, 1),
        "delivered_per_s": round(len(seen) / elapsed, 1),
        "delivered": len(seen),
        "duplicates": duplicates,
        "out_of_order": out_of_order,
        "lane_runs": runs,
        "problems": problems,
    }
    return report, problems


def main() -> int:
    report, problems = asyncio.run(run())
    return verdict("LANE SCALE", report, problems, RESULT)


if __name__ == "__main__":
    sys.exit(main())
