"""The suite's shared time-skipping server is replaced once a leftover workflow stops its clock
(tests/conftest.py `TimeSkippingServer`)."""

from __future__ import annotations

import pytest
from temporalio.api.testservice.v1 import LockTimeSkippingRequest

from tests.conftest import TimeSkippingServer, clock_skips


@pytest.mark.timeout(60)
async def test_a_stopped_clock_gets_a_new_server_and_a_skipping_one_is_kept() -> None:
    # Long enough that a loaded machine does not take a skipping clock for a stopped one.
    server = TimeSkippingServer(probe_s=5)
    try:
        first = await server.env()
        assert await server.env() is first
        assert server.replaced == 0

        # A time lock no one will release, as a leftover workflow's task leaves one, taken
        # directly: this test is about what the suite does with a stopped clock. No probe of our
        # own first: a probe that times out leaves its unlock pending on the server, and ours and
        # the server's freed the clock again (a loaded CI run failed so).
        await first.client.test_service.lock_time_skipping(LockTimeSkippingRequest())

        second = await server.env()
        assert second is not first
        assert server.replaced == 1
        # It skips at once; the wait only bounds a loaded machine's answer.
        assert await clock_skips(second, wait_s=20)
    finally:
        await server.close()
