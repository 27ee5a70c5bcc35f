"""Batch workflows end: a page that keeps failing is retried a bounded number of times, then
the batch ends failed with the reason its status shows (time-skipping server: the backoffs
between retries are skipped)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from durable_outbox_temporal.contract.dead_letters import (
    REDRIVE_BATCH_WORKFLOW_TYPE,
    DeadLetterFilter,
    RedriveBatchInput,
    RedriveBatchProgress,
)
from durable_outbox_temporal.contract.ids import redrive_batch_workflow_id
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError

from service.dead_letters import DeadLetterService
from service.items import ItemService
from tests.conftest import Stack, webhook_destination, workflow_result
from worker import default_operations_task_queue
from workflows.redrive_batch import BATCH_FAILED_ERROR, PAGE_RETRIES


async def until_retrying(handle: WorkflowHandle[Any, Any]) -> None:
    """Wait (time locked) until the batch's page has failed once: time unlocked before the
    workflow's first task completes, the time-skipping server would skip past that task's
    timeout, and on to the run's."""
    for _ in range(200):
        description = await handle.describe()
        if any(p.attempt > 1 for p in description.raw_description.pending_activities):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the page never failed")


async def until_closed(stack: Stack, handle: WorkflowHandle[Any, Any]) -> None:
    """Let the server skip time (the backoffs) until the batch has ended."""
    async with stack.env.time_skipping_unlocked():
        for _ in range(600):
            if (await handle.describe()).status != WorkflowExecutionStatus.RUNNING:
                return
            await asyncio.sleep(0.05)
    raise AssertionError("the batch never ended")


async def test_a_redrive_batch_with_a_filter_the_read_model_cannot_run_ends_failed(
    stack_factory: Any, fake_provider: Any, own_time_skipping_env: Any
) -> None:
    stack = await stack_factory(webhook_destination(fake_provider), env=own_time_skipping_env)
    service = DeadLetterService(
        ItemService(stack.outbox, stack.engine), default_operations_task_queue(stack.task_queue)
    )
    # The first instant of year 1, fourteen hours ahead of UTC: before year 1 in UTC.
    edge = datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14)))

    # Started past the service's checks (as by a version without them, or another client).
    batch_id = uuid.uuid4().hex
    handle = await stack.client.start_workflow(
        REDRIVE_BATCH_WORKFLOW_TYPE,
        RedriveBatchInput(
            service.operations_task_queue,
            RedriveBatchProgress("tests", DeadLetterFilter(failed_from=edge)),
        ),
        id=redrive_batch_workflow_id("tests", batch_id),
        task_queue=stack.task_queue,
        result_type=RedriveBatchProgress,
    )
    await until_retrying(handle)
    await until_closed(stack, handle)
    with pytest.raises(WorkflowFailureError) as failure:
        await workflow_result(handle)
    shown = await service.batch("tests", batch_id)
    await stack.record_history(handle.id)

    cause = failure.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == BATCH_FAILED_ERROR
    assert cause.message == (
        "page 1 failed after its retries:"
        " StatementError: (builtins.OverflowError) date value out of range"
    )
    assert shown.state == "failed" and not shown.progress.done
    assert shown.progress.errors == [cause.message]
    history = await handle.fetch_history()
    attempts = [
        event.activity_task_started_event_attributes.attempt
        for event in history.events
        if event.HasField("activity_task_started_event_attributes")
    ]
    assert attempts == [PAGE_RETRIES.maximum_attempts]
