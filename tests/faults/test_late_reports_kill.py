"""Delivery reports after a bulk item's window, their shard's worker SIGKILLed while it records
them in the items' rows: every report recorded once, none lost (a report a shard takes is in
its history, and the local activity that records it runs again on the next worker;
docs/decisions/late-delivery-reports.md)."""

from __future__ import annotations

import asyncio
import signal
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from durable_outbox_temporal import OutboxClient
from durable_outbox_temporal.contract.bulk import SHARD_QUERY, ShardView, shard_workflow_id
from durable_outbox_temporal.contract.ids import item_workflow_id, provider_idempotency_key
from durable_outbox_temporal.contract.item import DeliveryReport, RecipientStatus
from durable_outbox_temporal.destinations import DestinationRegistry

from readmodel import store
from readmodel.db import create_schema, make_engine
from service.reports import DeliveryReportService
from tests.conftest import email_destination, unique_name
from tests.faults.test_faults import EMAIL, start_worker, worker_env, write_config

ITEMS = 30
SETTLE_S = 60.0


async def until(check: Any, what: str) -> None:
    deadline = time.monotonic() + SETTLE_S
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.2)


async def test_late_reports_recorded_by_a_shard_whose_worker_is_killed_are_each_recorded_once(
    dev_env: Any, fake_provider: Any, tmp_path: Path
) -> None:
    destination = email_destination(
        fake_provider, mode="bulk", shards=1, report_window_s=1, submit_rate=100
    )
    config = tmp_path / "destinations.toml"
    write_config(config, destination)
    task_queue = unique_name("workflows")
    env = worker_env(dev_env, tmp_path, config, task_queue)
    engine = make_engine(env["DATABASE_URL"])
    create_schema(engine)
    outbox = OutboxClient(
        dev_env.client, DestinationRegistry({destination.name: destination}), task_queue
    )
    reports = DeliveryReportService(outbox, engine)
    keys = [unique_name(f"late{n}") for n in range(ITEMS)]
    item_ids = [item_workflow_id("late", key) for key in keys]
    shard = dev_env.client.get_workflow_handle(shard_workflow_id(destination.name, 0))
    worker = start_worker(env, tmp_path / "worker.log")
    try:
        for key in keys:
            await outbox.enqueue("late", destination.name, EMAIL, key=key)

        async def all_sent() -> bool:
            rows = [store.get_item(engine, item_id) for item_id in item_ids]
            return all(row is not None and row.view.status.value == "sent" for row in rows)

        async def all_let_go() -> bool:
            return not (await shard.query(SHARD_QUERY, result_type=ShardView)).held

        await until(all_sent, "not every item sent")
        await until(all_let_go, "the shard still holds items past their window")

        at = datetime(2026, 11, 30, tzinfo=UTC)
        late = [
            DeliveryReport(
                provider_idempotency_key(item_id), "b@example.com", RecipientStatus.BOUNCED, at
            )
            for item_id in item_ids
        ]
        # Half, then the worker killed at once (the shard records them as it takes them), the
        # other half while no worker runs, then a new worker.
        tally = await reports.receive(destination.name, late[: ITEMS // 2])
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        tally_rest = await reports.receive(destination.name, late[ITEMS // 2 :])
        worker = start_worker(env, tmp_path / "worker.log")

        async def all_bounced() -> bool:
            rows = [store.get_item(engine, item_id) for item_id in item_ids]
            return all(row is not None and str(row.view.delivery) == "bounced" for row in rows)

        await until(all_bounced, "a late report was lost")
        # Every report again, on the new worker: nothing changes.
        await reports.receive(destination.name, late)
        await shard.query(SHARD_QUERY, result_type=ShardView)
        await asyncio.sleep(1)
    finally:
        worker.terminate()
        worker.wait(timeout=30)

    assert tally.late + tally_rest.late == ITEMS
    for item_id in item_ids:
        events = store.item_events(engine, item_id)
        assert [e.type.value for e in events] == ["enqueued", "accepted", "sent", "delivery-report"]
        assert [e.seq for e in events] == [1, 2, 3, 4]
    engine.dispose()
