"""An ordering lane with `order = "submit"` while its worker is SIGKILLed, in item mode (one
item per submit activity, or runs of `lane_run`) and bulk mode.

The worker runs as a process of its own and is killed twice while one lane's items are being
submitted and polled (each operation takes a few polls, so the lane goes on past items still
polling). At the fake: every item delivered exactly once, and first submitted in the order it
was enqueued; in the read model: every item `sent`.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from durable_outbox_temporal import OutboxClient
from durable_outbox_temporal.contract.ids import item_workflow_id, provider_idempotency_key
from durable_outbox_temporal.destinations import DestinationRegistry

from readmodel import store
from readmodel.db import create_schema, make_engine
from tests.conftest import email_destination, unique_name
from tests.faults.test_faults import assert_exactly_once, start_worker, worker_env
from tests.workflows.test_lane import numbered_email, runs_in_item_mode

ITEMS = 24
SETTLE_S = 120.0


# Its item-mode-runs case missed its 120 s settle bound in 6 of 9 runs of the file on 2026-11-29
# with that day's lane change and 1 of 4 without (on 2026-11-28 in full-suite runs): a lane that
# continued as new in the middle of a run carried only the head's delivery, so an item behind it,
# submitted already, started again as new; the provider refused its second submit as another request
# under the same key, and the lane halted (`Lane.carry` carries every delivery of the run now; six
# of six runs of the file passed after). It stays serial in `make chaos` (`-m chaos`): two worker
# kills each.
@pytest.mark.chaos
@pytest.mark.parametrize("mode", ["item", "bulk", "item-runs"])
async def test_an_order_submit_lane_survives_worker_kills_in_order(
    dev_env: Any, fake_provider: Any, tmp_path: Path, mode: str
) -> None:
    bulk = {"mode": "bulk", "shards": 2, "submit_batch": 4} if mode == "bulk" else {}
    if mode == "item-runs":
        bulk = runs_in_item_mode(4, submit_rate=100)
    destination = email_destination(
        fake_provider,
        order="submit",
        submit_timeout_s=3,
        poll_interval_s=0.5,
        poll_backoff_multiplier=1,
        **bulk,
    )
    config = tmp_path / "destinations.toml"
    settings = "\n".join(f'{key} = "{value}"' for key, value in destination.settings.items())
    bulk_lines = 'mode = "bulk"\nshards = 2\nsubmit_batch = 4\n' if mode == "bulk" else ""
    if mode == "item-runs":
        bulk_lines = (
            f"lane_run = 4\n[destinations.{destination.name}.flow]\n"
            f'quotas = [{{ per = "1s", max = {int(destination.submit_rate)} }}]\n'
        )
    config.write_text(
        f"""[destinations.{destination.name}]
provider = "{destination.provider}"
submit_rate = {destination.submit_rate}
poll_rate = {destination.poll_rate}
poll_interval_s = 0.5
poll_backoff_multiplier = 1
submit_timeout_s = 3
order = "submit"
{bulk_lines}[destinations.{destination.name}.settings]
{settings}
"""
    )
    task_queue = unique_name("workflows")
    env = worker_env(dev_env, tmp_path, config, task_queue)
    engine = make_engine(env["DATABASE_URL"])
    create_schema(engine)
    outbox = OutboxClient(
        dev_env.client, DestinationRegistry({destination.name: destination}), task_queue
    )
    lane = unique_name("killed")
    keys = [unique_name(f"k{n}") for n in range(ITEMS)]
    for key in keys:
        # Each operation runs for two polls: the lane goes on while earlier items poll.
        await fake_provider.admin.script(
            provider_idempotency_key(item_workflow_id("ordered", key)), [{"running_polls": 2}]
        )
    await fake_provider.admin.set_faults(latency_ms=30)
    worker = start_worker(env, tmp_path / "worker.log")
    try:
        for n, key in enumerate(keys):
            await outbox.enqueue(
                "ordered", destination.name, numbered_email(n), key=key, ordering_key=lane
            )
        for _ in range(2):
            await asyncio.sleep(random.uniform(0.5, 1.5))
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            worker = start_worker(env, tmp_path / "worker.log")
        item_ids = [item_workflow_id("ordered", key) for key in keys]
        deadline = time.monotonic() + SETTLE_S
        while True:
            rows = [store.get_item(engine, item_id) for item_id in item_ids]
            if all(row is not None and row.view.status.value == "sent" for row in rows):
                break
            assert time.monotonic() < deadline, [
                (item_id, row.view.status if row else None)
                for item_id, row in zip(item_ids, rows, strict=True)
            ]
            await asyncio.sleep(0.5)
    finally:
        await fake_provider.admin.set_faults()
        worker.terminate()
        worker.wait(timeout=30)
        engine.dispose()

    await assert_exactly_once(fake_provider, item_ids)
    # Submitted in enqueue order: each item first reached the provider after the one before.
    first_submits = [
        (await fake_provider.admin.key_stats(provider_idempotency_key(item_id)))["request_times"][0]
        for item_id in item_ids
    ]
    assert first_submits == sorted(first_submits)
