"""The projector workflow on the dev server: one long-running activity per projector keeps its
read model current as events arrive; one that keeps failing faults while the other goes on, and
runs again once rebuilt. The runner heartbeats through back-offs longer than its heartbeat
timeout."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from datetime import timedelta
from itertools import pairwise

import pytest
from durable_outbox_temporal.contract.projector import projector_workflow_id
from sqlalchemy import Connection, Engine
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from activities.projectors import ProjectorActivities
from examples.labour.projectors import LABOUR_HISTORY_PROJECTOR
from readmodel.projectors import base as projectors
from readmodel.projectors.base import AsyncProjector, StoredEvent
from service.projectors import start_projectors
from tests.conftest import unique_name
from tests.readmodel.test_projectors import a_labour


async def until(probe: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not probe():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.1)


async def test_projectors_follow_the_event_store_and_a_failing_one_faults_alone(
    dev_env, stack_factory
) -> None:
    stack = await stack_factory(env=dev_env)  # hosts the Projector workflows
    # Unique names: a projector's workflow id and checkpoint are per namespace and database.
    labour = dataclasses.replace(LABOUR_HISTORY_PROJECTOR, name=unique_name("labour"))

    disk = {"full": True}

    def fails_while_the_disk_is_full(connection: Connection, event: StoredEvent) -> None:
        if disk["full"]:
            raise RuntimeError("the read model's disk is full")
        labour.apply(connection, event)

    # It writes labour_history's table too: its rebuild empties it and fills it in again.
    broken = AsyncProjector(
        unique_name("broken"), labour.aggregate_types, fails_while_the_disk_is_full, labour.table
    )
    runners = ProjectorActivities(
        stack.engine,
        {p.name: p for p in (labour, broken)},
        poll_interval_s=0.05,
        backoff_s=0.05,
        max_backoff_s=0.1,
    )
    queue = unique_name("projectors")
    async with Worker(stack.client, task_queue=queue, activities=[runners.run_projector]):
        await start_projectors(stack.client, stack.task_queue, queue, [labour.name, broken.name])
        a_labour(stack.engine, "lab-1", "m1")
        await until(lambda: projectors.status(stack.engine, labour).lag == 0)
        await until(lambda: projectors.status(stack.engine, broken).status == "faulted")
        # Events arriving later are projected as they come.
        a_labour(stack.engine, "lab-2", "m1")
        await until(lambda: projectors.status(stack.engine, labour).lag == 0)

        rows, _ = projectors.rows(stack.engine, labour, {"mother": "m1"})
        faulted = projectors.status(stack.engine, broken)
        # Its runner only watched while it was faulted; a rebuild sets it going again.
        disk["full"] = False
        projectors.rebuild(stack.engine, broken)
        await until(lambda: projectors.status(stack.engine, broken).lag == 0)
        rebuilt, _ = projectors.rows(stack.engine, labour, {"mother": "m1"})
        # A projector's history as production has it: open, its runner under way.
        await stack.record_history(projector_workflow_id(labour.name), "_projector")
        for name in (labour.name, broken.name):
            await stack.client.get_workflow_handle(projector_workflow_id(name)).terminate()

    assert [(r["labour_id"], r["contractions"], r["updates"]) for r in rows] == [
        ("lab-1", 2, 3),
        ("lab-2", 2, 3),
    ]
    assert faulted.consecutive_failures == 5 and faulted.lag == 24
    assert faulted.last_error == "RuntimeError: the read model's disk is full"
    assert rebuilt == rows


async def test_the_runner_heartbeats_through_a_back_off_longer_than_its_heartbeat_timeout(
    engine: Engine,
) -> None:
    a_labour(engine, "lab-1", "m1")

    def always_fails(connection: Connection, event: StoredEvent) -> None:
        raise RuntimeError("the read model's disk is full")

    broken = AsyncProjector(
        "broken", frozenset({"labour"}), always_fails, LABOUR_HISTORY_PROJECTOR.table
    )
    # A heartbeat every 0.4 s: a loaded CI machine stalled the loop 0.4 s once, which a 0.6 s
    # timeout (beats every 0.2 s) did not absorb.
    runner = ProjectorActivities(engine, {"broken": broken}, backoff_s=2.4, max_backoff_s=2.4)
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, heartbeat_timeout=timedelta(seconds=1.2))
    loop = asyncio.get_running_loop()
    beats: list[float] = []
    env.on_heartbeat = lambda *_: beats.append(loop.time())

    running = asyncio.create_task(env.run(runner.run_projector, "broken"))
    await until(lambda: projectors.status(engine, broken).consecutive_failures >= 2)
    env.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running

    # Two failures apart: at least one full back-off, twice the heartbeat timeout, went by.
    assert beats[-1] - beats[0] >= 2.4
    assert max(later - earlier for earlier, later in pairwise(beats)) < 1.2
