"""A bulk shard handing over while its queue is slow, not paused.

`python -m bench.hand_over_slow_queue` (`QUICK=1` for 600 items a round).

Since a hand-over takes back, after `HAND_OVER_GRACE`, what it has out and no worker took
(docs/decisions/hand-over-while-paused.md), a shard on a queue slower than what it has out (at
most `MAX_OUT` submits) takes some back at every hand-over, and its next run schedules them again
behind what waits on the queue. This measures what that costs against a hand-over that waits for
all of them (the grace set to a day, as runs did before), in alternating rounds, each on a stack
of its own:

- `items_per_s`: from the first hand-over of items to the last delivery;
- `taken_back`: activities cancelled over every run of the shard; `events_per_item`: the
  shard's history events over every run, by item; `runs`: the shard's runs;
- `sent_twice` and `not_sent`: items the fake provider took more than once, or never (both 0).

One shard, its own submits (`submit_batch` 1) at `SLOW_RATE` a second, `SLOW_ITEMS` items handed
over in batches of 100, the server suggesting continue-as-new past `SLOW_SUGGEST_EVENTS` events
(its default is in the thousands: this makes the hand-overs of a long backlog happen within a
round).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import statistics
import sys
import time
from contextlib import AsyncExitStack
from datetime import timedelta
from typing import Any

from durable_outbox_temporal import NewItem
from durable_outbox_temporal.contract.bulk import shard_workflow_id
from temporalio.api.enums.v1 import EventType

from bench.lanes import delivered
from bench.stack import webhook_stack
from configuration.settings import PROJECT_ROOT
from workflows import host

QUICK = os.environ.get("QUICK") == "1"
SLOW_RATE = float(os.environ.get("SLOW_RATE", "10"))
SLOW_ITEMS = int(os.environ.get("SLOW_ITEMS", "600" if QUICK else "2000"))
SLOW_SUGGEST_EVENTS = int(os.environ.get("SLOW_SUGGEST_EVENTS", "300"))
ROUNDS = int(os.environ.get("SLOW_ROUNDS", "2"))
BATCH = 100
# The hand-over as it is, and one that waits for everything out (as runs before the grace did).
GRACES = {"grace": host.HAND_OVER_GRACE, "wait_for_all": timedelta(days=1)}


async def one_round(grace: timedelta, round_: int) -> dict[str, Any]:
    host.HAND_OVER_GRACE = grace
    async with AsyncExitStack() as exits:
        stack = await webhook_stack(
            exits,
            name="slowqueue",
            db_file=PROJECT_ROOT / ".bench" / "hand_over_slow_queue.db",
            workflow_task_queue=f"hand-over-slow-queue-{round_}",
            suggest_continue_as_new_events=SLOW_SUGGEST_EVENTS,
            mode="bulk",
            shards=1,
            submit_batch=1,
            submit_rate=SLOW_RATE,
            poll_rate=SLOW_RATE * 4,
        )
        name = stack.destination.name
        built = [
            stack.outbox.new_item("slowqueue", NewItem(name, {"n": n}, f"n{n}"))
            for n in range(SLOW_ITEMS)
        ]
        began = time.monotonic()
        for start in range(0, len(built), BATCH):
            await stack.outbox.hand_over(built[start : start + BATCH], strict=True)
        ended = await delivered(stack, "slowqueue", len(built))
        client = stack.env.client
        workflow_id = shard_workflow_id(name, 0)
        runs = taken_back = events = 0
        async for execution in client.list_workflows(f'WorkflowId = "{workflow_id}"'):
            handle = client.get_workflow_handle(workflow_id, run_id=execution.run_id)
            history = [event async for event in handle.fetch_history_events()]
            runs += 1
            events += len(history)
            taken_back += sum(
                event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED for event in history
            )
        sent = [entry["payload"]["n"] for entry in await stack.fake.admin.deliveries(name)]
    return {
        "items_per_s": round(len(built) / (ended - began), 2),
        "taken_back": taken_back,
        "events_per_item": round(events / len(built), 2),
        "runs": runs,
        **sent_twice_or_never(sent, len(built)),
    }


def sent_twice_or_never(sent: list[int], items: int) -> dict[str, int]:
    """Of items numbered 0 to `items` - 1, given each delivery's number: those the provider
    took more than once, and those it never took."""
    counts = collections.Counter(sent)
    return {
        "sent_twice": sum(1 for count in counts.values() if count > 1),
        "not_sent": sum(1 for n in range(items) if n not in counts),
    }


async def hand_over_slow_queue() -> dict[str, Any]:
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in GRACES}
    for round_ in range(ROUNDS):
        for name, grace in GRACES.items():
            figures = await one_round(grace, round_)
            print(f"  round {round_ + 1} {name}: {figures}", flush=True)
            rounds[name].append(figures)
    return summary(rounds)


def summary(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each way's figures round by round, its median rate, and its items sent twice or never
    over every round."""
    return {
        name: {
            "items_per_s": [figures["items_per_s"] for figures in measured],
            "items_per_s_median": statistics.median(f["items_per_s"] for f in measured),
            "taken_back": [figures["taken_back"] for figures in measured],
            "events_per_item": [figures["events_per_item"] for figures in measured],
            "runs": [figures["runs"] for figures in measured],
            "sent_twice": sum(figures["sent_twice"] for figures in measured),
            "not_sent": sum(figures["not_sent"] for figures in measured),
        }
        for name, measured in rounds.items()
    }


def main() -> int:
    figures = asyncio.run(hand_over_slow_queue())
    print(json.dumps(figures, indent=2))
    return 1 if any_lost_or_doubled(figures) else 0


def any_lost_or_doubled(figures: dict[str, Any]) -> bool:
    return any(way["sent_twice"] or way["not_sent"] for way in figures.values())


if __name__ == "__main__":
    sys.exit(main())
