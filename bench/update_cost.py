"""What one awaited update costs: the floor under an ordered producer, whose each enqueue is an
`append_items` update (with start) to its lane, answered once the lane's worker has taken it.

A dev server of its own, persisted to SQLite as `make dev` runs it (`bench.start_cost`), and a
worker in this process running a workflow that does nothing but count (no product code): one
caller awaits `UPDATES` updates one after another, in alternating rounds of two kinds, each round
on a new workflow (a long history slows each update down):

- `update`: a plain update to the running workflow;
- `with start`: the same as an update with start (`USE_EXISTING`), as a lane append is sent.

Prints each round's p50 and p90 in milliseconds and each kind's median p50.
`python -m bench.update_cost`; docs/decisions/ordered-producer-floor.md
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from temporalio import workflow
from temporalio.client import Client, WithStartWorkflowOperation
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from bench.hot_aggregate import percentile
from bench.start_cost import connect_when_up, own_dev_server

UPDATES = 300
ROUNDS = 4
TASK_QUEUE = "update-cost"


@workflow.defn(name="UpdateCost")
class Counter:
    """Counts the updates it is sent until it is terminated."""

    def __init__(self) -> None:
        self.count = 0

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.update
    async def add(self, n: int) -> int:
        self.count += n
        return self.count


async def _round(client: Client, kind: str) -> list[float]:
    """Each awaited update's milliseconds, on a workflow of this round's own."""
    workflow_id = f"update-cost/{uuid.uuid4().hex}"
    handle = await client.start_workflow(Counter.run, id=workflow_id, task_queue=TASK_QUEUE)
    await handle.execute_update(Counter.add, 0)  # running, and its first task done
    took = []
    for _ in range(UPDATES):
        began = time.perf_counter()
        if kind == "update":
            await handle.execute_update(Counter.add, 1)
        else:
            start = WithStartWorkflowOperation(
                Counter.run,
                id=workflow_id,
                task_queue=TASK_QUEUE,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            )
            await client.execute_update_with_start_workflow(
                Counter.add, 1, start_workflow_operation=start
            )
        took.append((time.perf_counter() - began) * 1000)
    await handle.terminate("measured")
    return took


async def main() -> None:
    kinds = ["update", "with start"]
    p50s: dict[str, list[float]] = {kind: [] for kind in kinds}
    with tempfile.TemporaryDirectory() as folder, own_dev_server(Path(folder) / "u.db") as server:
        client = await connect_when_up(server[0])
        worker = Worker(
            client,
            task_queue=TASK_QUEUE,
            workflows=[Counter],
            workflow_runner=UnsandboxedWorkflowRunner(),
        )
        async with worker:
            await _round(client, "update")  # warm-up: connections, caches
            for round_ in range(ROUNDS):
                for kind in kinds if round_ % 2 == 0 else list(reversed(kinds)):
                    took = await _round(client, kind)
                    p50s[kind].append(percentile(took, 0.5))
                    print(
                        f"round {round_ + 1} {kind:>10}: p50 {percentile(took, 0.5):.2f} ms,"
                        f" p90 {percentile(took, 0.9):.2f} ms",
                        flush=True,
                    )
    for kind, values in p50s.items():
        print(f"{kind:>10}: median p50 {statistics.median(values):.2f} ms")


if __name__ == "__main__":
    started = time.monotonic()
    asyncio.run(main())
    print(f"({time.monotonic() - started:.0f} s)")
