"""`python -m tests.faults.relay_kill`: one relay pass (settings from the environment) that
SIGKILLs its own process right after it enqueued a row and before it marks the row relayed:
the one point where the item exists and the outbox table does not know."""

from __future__ import annotations

import asyncio
import os
import signal

from durable_outbox_temporal import OutboxClient, connect

from configuration.destinations import load_destinations
from configuration.settings import get_settings
from readmodel.db import make_engine
from service.relay import Relay


class KilledBeforeMarking(Relay):
    def _mark(self, row_id: int, status: str, error: str | None) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


async def main() -> None:
    settings = get_settings()
    outbox = OutboxClient(
        await connect(), load_destinations(settings.outbox_config), settings.workflow_task_queue
    )
    await KilledBeforeMarking(outbox, make_engine(settings.database_url)).relay_once()


if __name__ == "__main__":
    asyncio.run(main())
