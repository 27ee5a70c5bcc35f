"""A bulk shard with a backlog (`python -m bench.shard_backlog`): how long its workflow tasks
take while it holds many items, above all the first task of each run, which reads the held
items the run's input carries as they are (at most `ADMIT_PER_TASK`; the rest come in parts,
one per later task) before the workflow can yield.

One shard (`shards = 1`), `SHARD_KEYS` ordering keys x `PER_KEY` items of about 250 bytes,
handed over in batches of 100 to a destination at `SHARD_RATE` a second (the backlog), with
claim checks on as `worker.py` runs them (a shard's next-run input is megabytes). After the last
delivery, every run of the shard is read back from Temporal:

- `shard_first_task_ms`: the slowest first workflow task of a run (reading the carried items);
- `shard_task_max_ms` / `shard_task_p50_ms`: over every workflow task of every run;
- `shard_continue_task_ms`: the slowest last workflow task of a run that continued as new (it
  writes every item the shard holds: not bounded by `ADMIT_PER_TASK`; its time from started to
  completed also holds the claim check's upload);
- `shard_failed_tasks`: workflow tasks that failed (the SDK's 2 s deadlock check, a payload
  over Temporal's limit): any fails the run, as a failing task held often enough stops a shard.

The SDK fails a workflow task whose code does not yield within 2 s: a shard whose first task
read every item it held would, holding enough, fail the first task of every run and deliver
nothing (docs/decisions/shard-carry-in-parts.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from durable_outbox_temporal import NewItem
from durable_outbox_temporal.contract.bulk import shard_workflow_id
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from bench.lanes import delivered
from bench.stack import webhook_stack
from configuration.settings import PROJECT_ROOT

QUICK = os.environ.get("QUICK") == "1"
SHARD_KEYS = int(os.environ.get("SHARD_KEYS", "400" if QUICK else "2000"))
PER_KEY = 5
SHARD_RATE = float(os.environ.get("SHARD_RATE", "50"))
BATCH = 100
# As `worker.py` by default (CLAIM_CHECK_BYTES).
CLAIM_CHECK_BYTES = 64 * 1024


@dataclass
class RunTasks:
    """One run's workflow tasks: how long each took, from started to completed, in order, and
    the failures."""

    durations_ms: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    # The run ended continuing as new: its last task wrote the next run's input.
    continued: bool = False


def run_tasks(events: list[HistoryEvent]) -> RunTasks:
    """The workflow tasks of one run's history."""
    found = RunTasks()
    started: dict[int, datetime] = {}
    for event in events:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            started[event.event_id] = event.event_time.ToDatetime()
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            began = started.get(event.workflow_task_completed_event_attributes.started_event_id)
            if began is not None:
                seconds = (event.event_time.ToDatetime() - began).total_seconds()
                found.durations_ms.append(round(seconds * 1000, 1))
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            found.failures.append(event.workflow_task_failed_event_attributes.failure.message)
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            found.continued = True
    return found


def figures_of(runs: list[RunTasks]) -> dict[str, Any]:
    """The scenario's figures over every run of the shard."""
    every = [ms for run in runs for ms in run.durations_ms]
    firsts = [run.durations_ms[0] for run in runs if run.durations_ms]
    lasts = [run.durations_ms[-1] for run in runs if run.continued and run.durations_ms]
    return {
        "shard_runs": len(runs),
        "shard_first_task_ms": max(firsts, default=0.0),
        "shard_continue_task_ms": max(lasts, default=0.0),
        "shard_task_max_ms": max(every, default=0.0),
        "shard_task_p50_ms": round(statistics.median(every), 1) if every else 0.0,
        "shard_failed_tasks": [message for run in runs for message in run.failures],
    }


async def shard_runs(client: Client, workflow_id: str) -> list[RunTasks]:
    runs = []
    async for execution in client.list_workflows(f'WorkflowId = "{workflow_id}"'):
        handle = client.get_workflow_handle(workflow_id, run_id=execution.run_id)
        runs.append(run_tasks([event async for event in handle.fetch_history_events()]))
    return runs


async def shard_backlog() -> dict[str, Any]:
    async with AsyncExitStack() as exits:
        # One shard in bulk mode, slower than the items come: the backlog.
        destination: dict[str, Any] = {"mode": "bulk", "shards": 1, "submit_rate": SHARD_RATE}
        destination |= {"poll_rate": SHARD_RATE, "submit_batch": max(1, int(SHARD_RATE // 4))}
        stack = await webhook_stack(
            exits,
            name="backlog",
            db_file=PROJECT_ROOT / ".bench" / "shard_backlog.db",
            workflow_task_queue="shard-backlog-workflows",
            claim_check_bytes=CLAIM_CHECK_BYTES,
            **destination,
        )
        name = stack.destination.name
        built = [
            stack.outbox.new_item(
                "backlog",
                NewItem(
                    name, {"k": k, "n": n, "pad": "x" * 200}, f"k{k}-{n}", ordering_key=f"k{k}"
                ),
            )
            for n in range(PER_KEY)
            for k in range(SHARD_KEYS)
        ]
        began = time.monotonic()
        for start in range(0, len(built), BATCH):
            await stack.outbox.hand_over(built[start : start + BATCH], strict=True)
        ended = await delivered(stack, "backlog", len(built))
        runs = await shard_runs(stack.env.client, shard_workflow_id(name, 0))
    return {
        "shard_items": len(built),
        "shard_items_per_s": round(len(built) / (ended - began), 1),
        **figures_of(runs),
    }


def main() -> int:
    figures = asyncio.run(shard_backlog())
    print(json.dumps(figures, indent=2))
    return 1 if figures["shard_failed_tasks"] else 0


if __name__ == "__main__":
    sys.exit(main())
