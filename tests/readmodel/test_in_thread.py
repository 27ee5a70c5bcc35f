"""`readmodel.db.in_thread`: a read cancelled while its thread runs lets the thread finish (and
return its connection) before the cancellation goes on."""

from __future__ import annotations

import asyncio
import threading

import pytest
from sqlalchemy import Engine, text

from readmodel.db import in_thread


async def test_a_cancelled_read_waits_for_its_thread_and_its_connection_goes_back(
    engine: Engine,
) -> None:
    started, release = threading.Event(), threading.Event()

    def read() -> int:
        with engine.connect() as connection:
            started.set()
            release.wait(10)
            return connection.execute(text("SELECT 1")).scalar_one()

    task = asyncio.create_task(in_thread(read))
    await asyncio.to_thread(started.wait, 10)
    task.cancel()
    await asyncio.sleep(0.2)
    # Cancelled, but still waiting on the thread, whose connection is out.
    assert not task.done()
    assert engine.pool.checkedout() == 1
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert engine.pool.checkedout() == 0


async def test_an_uncancelled_read_answers_and_its_errors_reach_the_caller(engine: Engine) -> None:
    def fail() -> None:
        raise ValueError("no")

    assert await in_thread(lambda: 42) == 42
    with pytest.raises(ValueError, match="no"):
        await in_thread(fail)
