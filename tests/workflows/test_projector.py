"""The projector workflow on the dev server: one long-running activity per projector keeps its
read model current as events arrive; one that keeps failing faults while the other goes on."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

from sqlalchemy import Connection
from temporalio.worker import Worker

from activities.projectors import ProjectorActivities
from contract.projector import projector_workflow_id
from readmodel.projectors import PROJECTORS
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
    labour = dataclasses.replace(PROJECTORS["labour_history"], name=unique_name("labour"))

    def always_fails(connection: Connection, event: StoredEvent) -> None:
        raise RuntimeError("the read model's disk is full")

    broken = AsyncProjector(
        unique_name("broken"), labour.aggregate_types, always_fails, labour.table
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
        for name in (labour.name, broken.name):
            await stack.client.get_workflow_handle(projector_workflow_id(name)).terminate()

    assert [(r["labour_id"], r["contractions"], r["updates"]) for r in rows] == [
        ("lab-1", 2, 3),
        ("lab-2", 2, 3),
    ]
    assert faulted.consecutive_failures == 5 and faulted.lag == 24
    assert faulted.last_error == "RuntimeError: the read model's disk is full"
