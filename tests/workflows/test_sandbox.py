"""The suite's workers run workflows in Temporal's sandbox; production's do not (why:
docs/decisions/unsandboxed-workflows.md).

A non-deterministic call (clock, randomness, I/O) on a new workflow branch then fails the test
that takes the branch, instead of passing here and breaking replay in production.
"""

from __future__ import annotations

import httpx
import pytest
from temporalio import workflow
from temporalio.worker import UnsandboxedWorkflowRunner
from temporalio.worker.workflow_sandbox import (
    RestrictedWorkflowAccessError,
    SandboxedWorkflowRunner,
)

from tests.conftest import unique_name
from tests.workflows.clock_at_import import ReadsTheClockAtImport
from worker import SandboxCheckingOnce, build_workers
from workflows.outbox_item import OutboxItemWorkflow


async def test_the_stack_every_test_uses_runs_workflows_sandboxed(stack_factory) -> None:
    stack = await stack_factory()

    runner = stack.running[0].config()["workflow_runner"]

    assert isinstance(runner, SandboxedWorkflowRunner)


async def test_production_workers_run_workflows_unsandboxed(time_skipping_env, engine) -> None:
    async with httpx.AsyncClient() as http_client:
        workers = build_workers(
            time_skipping_env.client,
            destinations=[],
            http_client=http_client,
            engine=engine,
            workflow_task_queue=unique_name("sandbox"),
        )

    assert isinstance(workers[0].config()["workflow_runner"], UnsandboxedWorkflowRunner)


async def test_each_definition_is_checked_once_and_a_refused_one_every_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The suite's sandbox checks a workflow definition once per process (`SandboxCheckingOnce`):
    a definition it passed is not checked again; one it refused is refused again, never
    remembered as checked."""
    checks: list[type] = []
    check = SandboxedWorkflowRunner.prepare_workflow

    def counted(runner: SandboxedWorkflowRunner, defn: workflow._Definition) -> None:
        checks.append(defn.cls)
        check(runner, defn)

    monkeypatch.setattr(SandboxedWorkflowRunner, "prepare_workflow", counted)
    monkeypatch.setattr(SandboxCheckingOnce, "_checked", set())
    passed = workflow._Definition.must_from_class(OutboxItemWorkflow)
    refused = workflow._Definition.must_from_class(ReadsTheClockAtImport)
    for _ in range(2):
        SandboxCheckingOnce().prepare_workflow(passed)
        with pytest.raises(RestrictedWorkflowAccessError):
            SandboxCheckingOnce().prepare_workflow(refused)

    assert checks == [OutboxItemWorkflow, ReadsTheClockAtImport, ReadsTheClockAtImport]
