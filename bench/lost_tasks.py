"""`python -m bench.lost_tasks`: what a submit that never reached a worker costs a round, with and
without the delivery activities' heartbeat timeout (docs/decisions/delivery-heartbeats.md).

Rounds of `ITEMS` webhook items enqueued at once on one stack (`bench.stack`: a dev server, the
fake provider, the workers in this process), alternating a round whose submits are scheduled
without a heartbeat timeout (as before) and one with it. A dev server this loaded records some
activity starts that reach no worker (temporalio/temporal#11733): such a submit is tried again
only when its timeout runs out, and the round ends when its last item is sent. Prints each
round's time and its slowest item (`LOST_TASKS_ITEMS`, `LOST_TASKS_ROUNDS`).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import select
from temporalio.worker import (
    Interceptor,
    StartActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)
from temporalio.workflow import ActivityHandle

from bench.stack import BenchStack, webhook_stack
from configuration.settings import PROJECT_ROOT
from readmodel.models import ITEMS as ITEMS_TABLE

ITEMS = int(os.environ.get("LOST_TASKS_ITEMS", "500"))
ROUNDS = int(os.environ.get("LOST_TASKS_ROUNDS", "4"))
# A round is given up after this long.
ROUND_LIMIT_S = 300.0


async def one_round(stack: BenchStack, outbox: str) -> tuple[float, float]:
    """Enqueue the round's items together; seconds until the last is sent, and the slowest
    item's time from its enqueue to its sending."""
    began = time.monotonic()
    await asyncio.gather(
        *(
            stack.outbox.enqueue(outbox, stack.destination.name, {"n": n}, key=f"{outbox}-{n}")
            for n in range(ITEMS)
        )
    )
    query = select(ITEMS_TABLE.c.created_at, ITEMS_TABLE.c.finished_at).where(
        ITEMS_TABLE.c.outbox == outbox, ITEMS_TABLE.c.status == "sent"
    )
    while True:
        with stack.engine.connect() as connection:
            rows = connection.execute(query).all()
        if len(rows) >= ITEMS:
            break
        if time.monotonic() - began > ROUND_LIMIT_S:
            raise TimeoutError(f"{outbox}: {len(rows)} of {ITEMS} sent")
        await asyncio.sleep(0.5)
    slowest = max((finished - created).total_seconds() for created, finished in rows)
    return time.monotonic() - began, slowest


@dataclass
class WithoutHeartbeatTimeout(Interceptor):
    """While `on`, the stack's workflows schedule their activities without a heartbeat timeout,
    as the release before did."""

    on: bool = False

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        switch = self

        class Inbound(WorkflowInboundInterceptor):
            def init(self, outbound: WorkflowOutboundInterceptor) -> None:
                super().init(_Outbound(outbound, switch))

        return Inbound


class _Outbound(WorkflowOutboundInterceptor):
    def __init__(self, next: WorkflowOutboundInterceptor, switch: WithoutHeartbeatTimeout) -> None:
        super().__init__(next)
        self._switch = switch

    def start_activity(self, input: StartActivityInput) -> ActivityHandle[Any]:
        if self._switch.on:
            input = replace(input, heartbeat_timeout=None)
        return super().start_activity(input)


async def main() -> None:
    switch = WithoutHeartbeatTimeout()
    times: dict[str, list[float]] = {"without": [], "with": []}
    async with AsyncExitStack() as exits:
        stack = await webhook_stack(
            exits,
            name="lost-tasks",
            db_file=PROJECT_ROOT / ".bench" / "lost_tasks.db",
            workflow_task_queue="lost-tasks-workflows",
            interceptors=[switch],
            submit_rate=1000,
            poll_rate=1000,
        )
        for number in range(ROUNDS):
            kind = "without" if number % 2 == 0 else "with"
            switch.on = kind == "without"
            took, slowest = await one_round(stack, f"round-{number}")
            times[kind].append(took)
            print(
                f"round {number} {kind} the heartbeat timeout: {ITEMS} items in {took:.1f} s "
                f"({ITEMS / took:.1f}/s), slowest item {slowest:.1f} s",
                flush=True,
            )
    for kind, seconds in times.items():
        if seconds:
            print(f"{kind}: median round {statistics.median(seconds):.1f} s", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
