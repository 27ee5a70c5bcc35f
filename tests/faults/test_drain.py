"""A worker stopped by SIGTERM (a deploy's rolling restart) drains: the submit it has in flight
at the provider finishes within `WORKER_SHUTDOWN_GRACE_S` and is recorded, rather than being cut
mid-request and sent again by the next worker."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

from durable_outbox_temporal import OutboxClient
from durable_outbox_temporal.contract.ids import provider_idempotency_key
from durable_outbox_temporal.destinations import DestinationRegistry
from temporalio.api.enums.v1 import EventType

from devstack.outcomes import outcomes
from tests.conftest import email_destination, unique_name
from tests.faults.test_faults import EMAIL, start_worker, worker_env, write_config

# How long the fake provider holds each submit: the request a SIGTERM lands in the middle of.
SUBMIT_LATENCY_S = 3.0
GRACE_S = 30.0
ACTIVITY_FAILURES = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT,
    EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED,
}


async def test_a_sigtermed_worker_finishes_its_in_flight_submit(
    dev_env, fake_provider, tmp_path: Path
) -> None:
    destination = email_destination(
        fake_provider, submit_timeout_s=20, poll_interval_s=0.5, poll_backoff_multiplier=1
    )
    config = tmp_path / "destinations.toml"
    write_config(config, destination)
    task_queue = unique_name("workflows")
    env = {
        **worker_env(dev_env, tmp_path, config, task_queue),
        "WORKER_SHUTDOWN_GRACE_S": str(GRACE_S),
    }
    log = tmp_path / "worker.log"
    outbox = OutboxClient(
        dev_env.client, DestinationRegistry({destination.name: destination}), task_queue
    )
    await fake_provider.admin.set_faults(latency_ms=SUBMIT_LATENCY_S * 1000)
    worker = start_worker(env, log)
    try:
        item_id = (await outbox.enqueue("drain", destination.name, EMAIL, key="drain")).item_id
        key = provider_idempotency_key(item_id)
        for _ in range(1200):  # the submit in flight: a counter in another process, polled
            if (await fake_provider.admin.key_stats(key))["submits"]:
                break
            await asyncio.sleep(0.05)
        stopped_at = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        exit_code = await asyncio.to_thread(worker.wait, GRACE_S + 30)
        drained_s = time.monotonic() - stopped_at
        await fake_provider.admin.set_faults()
        history = await dev_env.client.get_workflow_handle(item_id).fetch_history()
        worker = start_worker(env, log)
        results = await outcomes(dev_env.client, [item_id])
    finally:
        await fake_provider.admin.set_faults()
        worker.terminate()
        worker.wait(timeout=GRACE_S + 30)

    output = log.read_text()
    assert exit_code == 0, output
    assert "Traceback" not in output
    assert "in-flight activities get 30.0s to finish" in output
    # It waited for the request it had in flight, and no longer than that took.
    assert drained_s < GRACE_S, drained_s
    completed = [
        event
        for event in history.events
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
    ]
    assert completed, "the submit in flight at SIGTERM was not recorded as completed"
    assert not [event for event in history.events if event.event_type in ACTIVITY_FAILURES]
    assert results == {item_id: "sent"}
    stats = await fake_provider.admin.key_stats(key)
    assert stats["submits"] == 1 and stats["deliveries"] == 1, stats
