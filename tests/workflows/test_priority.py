"""Under a backlog, lower priority numbers go first
(`durable_outbox_temporal/contract/priority.py`): in item mode
through Temporal's priority keys on the dev server, in bulk mode in the shard's own order."""

from __future__ import annotations

import asyncio
import statistics
import time
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from durable_outbox_temporal import InvalidRequest, NewItem, OutboxClient
from durable_outbox_temporal.validation import validate_new_item

from bench.stack import webhook_stack
from devstack.fake_provider import FakeProvider
from tests.conftest import Stack, unique_name, webhook_destination
from workflows.host import MAX_OUT

LOW, HIGH = 30, 3


async def urgent_after_backlog(
    outbox: OutboxClient, fake: FakeProvider, destination: str, low: int
) -> tuple[list[tuple[int, float]], float]:
    """`low` priority-5 items, then (once they are draining) HIGH priority-1 items; each
    delivery's (priority, arrival time) at the fake in arrival order, and when the urgent
    items were handed over."""

    def build(n: int, priority: int) -> Any:
        key = unique_name("high" if priority == 1 else "low")
        payload = {"n": n, "p": priority}
        return outbox.new_item("tests", NewItem(destination, payload, key, priority=priority))

    await outbox.hand_over([build(n, 5) for n in range(low)], strict=True)
    for _ in range(200):  # until the backlog drains at the rate
        if len(await fake.admin.deliveries(destination)) >= 2:
            break
        await asyncio.sleep(0.05)
    urgent_at = time.time()
    await outbox.hand_over([build(n, 1) for n in range(HIGH)], strict=True)
    for _ in range(1200):
        entries = await fake.admin.deliveries(destination)
        if len(entries) >= low + HIGH:
            break
        await asyncio.sleep(0.1)
    return [(entry["payload"]["p"], entry["at"]) for entry in entries], urgent_at


def check_overtaken(arrivals: list[tuple[int, float]], urgent_at: float, low: int) -> None:
    assert sorted(p for p, _ in arrivals) == [1] * HIGH + [5] * low  # each delivered once
    # Judged by the median urgent arrival, not the last: one urgent submit whose start reached
    # no worker (docs/decisions/delivery-heartbeats.md) is started again seconds later on a
    # loaded machine, and would make a working priority look like none.
    median_urgent_at = statistics.median(at for p, at in arrivals if p == 1)
    still_waiting = [at for p, at in arrivals if p == 5 and at > urgent_at]
    overtaking = [at for at in still_waiting if at < median_urgent_at]
    # A real backlog was waiting when the urgent items came, and most of it went after them:
    # only what was already on its way went before (the server dispatches about a second's
    # worth ahead, more on a loaded machine). Without priorities all of it goes before them.
    assert len(still_waiting) >= low // 2, arrivals
    behind = len(still_waiting) - len(overtaking)
    assert behind >= len(still_waiting) // 3, (len(overtaking), len(still_waiting), arrivals)


async def test_urgent_items_overtake_a_backlog_in_item_mode(
    dev_env: Any, stack_factory: Any, fake_provider: FakeProvider
) -> None:
    # 5 submits a second: the 30 waiting items are a backlog of six seconds.
    destination = webhook_destination(fake_provider, submit_rate=5.0)
    stack: Stack = await stack_factory(destination, env=dev_env)
    arrivals, urgent_at = await urgent_after_backlog(
        stack.outbox, fake_provider, destination.name, LOW
    )
    check_overtaken(arrivals, urgent_at, LOW)


async def test_urgent_items_overtake_a_backlog_in_a_bulk_shard(tmp_path: Path) -> None:
    # A stack of its own: the suite's dev server suggests continue-as-new after 40 events, and
    # a shard continuing as new holds new submits until those out come back. More items than a
    # shard has out at once (MAX_OUT), so the shard's own order is used as well as the server's.
    low = 2 * MAX_OUT
    async with AsyncExitStack() as exits:
        stack = await webhook_stack(
            exits,
            name="priority-bulk",
            db_file=tmp_path / "read.db",
            workflow_task_queue=unique_name("priority"),
            submit_rate=20.0,
            mode="bulk",
            shards=1,
        )
        arrivals, urgent_at = await urgent_after_backlog(
            stack.outbox, stack.fake, stack.destination.name, low
        )
    check_overtaken(arrivals, urgent_at, low)


def test_a_priority_outside_one_to_five_is_refused() -> None:
    for bad in (0, 6, -1):
        with pytest.raises(InvalidRequest, match="priority must be 1"):
            validate_new_item(
                "o",
                "k",
                ordering_key=None,
                not_before=None,
                max_attempts=None,
                now=datetime.now(UTC),
                priority=bad,
            )
