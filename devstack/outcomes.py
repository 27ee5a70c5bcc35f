"""How outbox items ended, read from their workflows (fault-injection tests, `make chaos`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta

from temporalio.client import Client, WorkflowFailureError
from temporalio.service import RPCError, RPCStatusCode

# What `outcomes` reports for an item whose workflow was still running at the deadline.
UNFINISHED = "unfinished"
# Each wait is a long poll; the server refuses more than 1,000 per namespace at once.
MAX_WAITERS = 200
WAIT_TURN = timedelta(seconds=5)


async def outcomes(
    client: Client,
    item_ids: list[str],
    timeout_s: float = 150.0,
    on_final: Callable[[str, str], None] | None = None,
) -> dict[str, str]:
    """Each item's end by id: its final status (`failed` for any failed workflow), or
    `UNFINISHED` if it was still running after `timeout_s`. `on_final(item_id, status)` is
    called as each item ends, so a caller can act on progress."""

    waiters = asyncio.Semaphore(MAX_WAITERS)

    async def one(item_id: str) -> str:
        handle = client.get_workflow_handle(item_id)
        while True:
            try:
                # A short deadline hands the slot on (the semaphore is FIFO), so an item that
                # ended never waits behind slow ones until the overall timeout.
                async with waiters:
                    view = await handle.result(rpc_timeout=WAIT_TURN)
                status = str(view["status"])
                break
            except RPCError as err:
                if err.status not in (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED):
                    raise
            except WorkflowFailureError:
                status = "failed"
                break
        if on_final is not None:
            on_final(item_id, status)
        return status

    if not item_ids:
        return {}
    tasks = {item_id: asyncio.create_task(one(item_id)) for item_id in item_ids}
    _, pending = await asyncio.wait(tasks.values(), timeout=timeout_s)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return {
        item_id: UNFINISHED if task in pending else task.result() for item_id, task in tasks.items()
    }
