"""What one workflow start costs the Temporal dev server: the floor under an item-mode enqueue
(each starts its item's workflow) and under an aggregate's first command (an update with start).

A dev server of its own, persisted to SQLite as `make dev` runs it (`devstack.temporal_server`),
with no worker: each start waits on a `start_delay` hours away, as the bench's enqueue-latency
items do, so no workflow task runs and only the start is counted. Two kinds of start in
alternating rounds, `STARTS` each, `AT_ONCE` at a time:

- `bare`: a small payload, no search attributes, no memo;
- `item's`: an item's start as the API makes it (`OutboxClient.enqueue` to the bench's
  `bench-email` destination with the bench's email payload: its search attributes, memo,
  summary and priority, through the product's payload converter).

Prints the server's CPU per start for each round and the median. `python -m bench.start_cost`;
docs/decisions/workflow-start-floor.md
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from durable_outbox_temporal import OutboxClient
from durable_outbox_temporal.codec import data_converter
from temporalio.client import Client

from bench.naive import EMAIL
from bench.run import CONFIG, cpu_seconds
from bench.upgrade import free_port
from configuration.destinations import load_destinations
from devstack.temporal_server import dev_server_command

STARTS = 400
AT_ONCE = 20
ROUNDS = 4
HOLD = timedelta(hours=6)


@contextlib.contextmanager
def own_dev_server(db_file: Path) -> Iterator[tuple[str, int]]:
    port = free_port()
    command = dev_server_command(db_file, port=port, ui_port=free_port())
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield f"127.0.0.1:{port}", process.pid
    finally:
        process.terminate()
        process.wait()


async def connect_when_up(address: str) -> Client:
    for _ in range(300):
        with contextlib.suppress(Exception):
            return await Client.connect(address, data_converter=data_converter(None))
        await asyncio.sleep(0.1)
    raise TimeoutError(f"no dev server at {address}")


async def _server_ms_per_start(client: Client, server_pid: int, kind: str) -> float:
    # The destination's URL is never called: no worker runs the items.
    outbox = OutboxClient(
        client,
        load_destinations(CONFIG, {"FAKE_PROVIDER_URL": "http://127.0.0.1:9"}),
        "start-cost-no-worker",
    )
    hold_until = datetime.now(UTC) + HOLD
    gate = asyncio.Semaphore(AT_ONCE)

    async def one() -> None:
        async with gate:
            if kind == "bare":
                await client.start_workflow(
                    "OutboxItem",
                    {"n": 1},
                    id=f"start-cost/{uuid.uuid4().hex}",
                    task_queue="start-cost-no-worker",
                    start_delay=HOLD,
                )
            else:
                await outbox.enqueue(
                    "bench", "bench-email", EMAIL, key=uuid.uuid4().hex, not_before=hold_until
                )

    before = cpu_seconds(server_pid)
    await asyncio.gather(*(one() for _ in range(STARTS)))
    # The server records visibility and timers after it answers: count those too.
    await asyncio.sleep(2)
    return (cpu_seconds(server_pid) - before) * 1000 / STARTS


async def main() -> None:
    kinds = ["bare", "item's"]
    figures: dict[str, list[float]] = {kind: [] for kind in kinds}
    with tempfile.TemporaryDirectory() as folder, own_dev_server(Path(folder) / "t.db") as server:
        address, pid = server
        client = await connect_when_up(address)
        await _server_ms_per_start(client, pid, "bare")  # warm-up: caches, the first pages
        for round_ in range(ROUNDS):
            for kind in kinds if round_ % 2 == 0 else list(reversed(kinds)):
                figures[kind].append(await _server_ms_per_start(client, pid, kind))
    for kind, values in figures.items():
        shown = ", ".join(f"{value:.2f}" for value in values)
        print(f"{kind:>7} start: server CPU ms {shown} (median {statistics.median(values):.2f})")


if __name__ == "__main__":
    started = time.monotonic()
    asyncio.run(main())
    print(f"({time.monotonic() - started:.0f} s)")
