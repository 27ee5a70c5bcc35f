"""Caps hold across two worker processes sharing one read model, with one of them SIGKILLed
mid-burst (`flowcontrol/caps.py`): at the fake provider no tenant ever has more than its cap
out at once, nor the destination more than its own, and every item is delivered exactly once.
The killed worker's permits are held until their lease ends, so none is handed out twice."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

from durable_outbox_temporal import OutboxClient
from durable_outbox_temporal.contract.ids import item_workflow_id
from durable_outbox_temporal.destinations import DestinationRegistry

from devstack.outcomes import outcomes
from tests.conftest import unique_name, webhook_destination
from tests.faults.test_faults import (
    assert_exactly_once,
    free_port,
    start_worker,
    worker_env,
    write_config,
)

TENANTS = ("a", "b", "c")
PER_TENANT = 6


async def test_caps_hold_across_two_workers_and_a_kill(
    dev_env: Any, fake_provider: Any, tmp_path: Path
) -> None:
    destination = webhook_destination(
        fake_provider,
        submit_rate=50.0,
        submit_timeout_s=3,
        backoff_initial_s=0.2,
        flow={"max_in_flight": 2, "key_max_in_flight": 1},
    )
    config = tmp_path / "destinations.toml"
    write_config(config, destination)
    task_queue = unique_name("workflows")
    env = worker_env(dev_env, tmp_path, config, task_queue)
    outbox = OutboxClient(
        dev_env.client, DestinationRegistry({destination.name: destination}), task_queue
    )
    # Each request stays out 300 ms: long enough for two workers' requests to overlap.
    await fake_provider.admin.set_endpoint_fault(destination.name, latency_ms=300)
    # Two processes, each with its own metrics port.
    workers = [
        start_worker(
            {**env, "WORKER_METRICS_ADDRESS": f"127.0.0.1:{free_port()}"},
            tmp_path / f"worker-{n}.log",
        )
        for n in (1, 2)
    ]
    try:
        keys = [f"{tenant}-{n}" for tenant in TENANTS for n in range(PER_TENANT)]
        for key in keys:
            tenant = key.split("-")[0]
            await outbox.enqueue(
                "caps",
                destination.name,
                {"tenant": tenant, "key": key},
                key=key,
                concurrency_key=tenant,
            )
        await asyncio.sleep(1.5)
        assert [worker.poll() for worker in workers] == [None, None], "a worker did not start"
        workers[0].send_signal(signal.SIGKILL)
        workers[0].wait()
        item_ids = [item_workflow_id("caps", key) for key in keys]
        results = await outcomes(dev_env.client, item_ids)
    finally:
        await fake_provider.admin.clear_endpoint_fault(destination.name)
        for worker in workers:
            if worker.poll() is None:
                worker.terminate()
                worker.wait(timeout=30)

    assert set(results.values()) == {"sent"}, results
    await assert_exactly_once(fake_provider, item_ids)
    prefix = f"/webhook/{destination.name}"
    per_tenant = {
        t: await fake_provider.admin.max_in_flight(prefix, where={"tenant": t}) for t in TENANTS
    }
    assert per_tenant == dict.fromkeys(TENANTS, 1), per_tenant
    assert await fake_provider.admin.max_in_flight(prefix) == 2
