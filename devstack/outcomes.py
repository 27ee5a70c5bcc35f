"""How outbox items ended, read from their workflows (fault-injection tests, `make chaos`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from temporalio.client import Client, WorkflowFailureError

# What `outcomes` reports for an item whose workflow was still running at the deadline.
UNFINISHED = "unfinished"


async def outcomes(
    client: Client,
    item_ids: list[str],
    timeout_s: float = 150.0,
    on_final: Callable[[str, str], None] | None = None,
) -> dict[str, str]:
    """Each item's end by id: its final status (`failed` for any failed workflow), or
    `UNFINISHED` if it was still running after `timeout_s`. `on_final(item_id, status)` is
    called as each item ends, so a caller can act on progress."""

    async def one(item_id: str) -> str:
        try:
            view = await client.get_workflow_handle(item_id).result()
            status = str(view["status"])
        except WorkflowFailureError:
            status = "failed"
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
