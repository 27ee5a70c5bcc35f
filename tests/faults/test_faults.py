"""Fault injection at small scale: a worker process killed with SIGKILL mid-run, and a provider
storm. Each asserts at the fake provider: nothing lost, nothing delivered twice, no request
before a Retry-After elapsed.

Both run in `make chaos` (`-m chaos`), not in `make test`: they are the small versions of the
chaos run's own two scenarios (`bench/chaos.py`: the storm and three worker SIGKILLs, in item and
bulk mode, at scale), and together they held a test process for about a minute of the suite's
wall time, with a worker process per kill (docs/decisions/parallel-tests.md). The suite keeps
worker kills in `test_aggregate_kill.py`, `test_effect_kill.py`, `test_caps_kill.py` and
`test_drain.py`, the server killed under a running worker in `test_restarts.py`, and provider
throttle storms in `tests/api/test_throttle.py`.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from durable_outbox_temporal import OutboxClient
from durable_outbox_temporal.contract.ids import provider_idempotency_key
from durable_outbox_temporal.destinations import DestinationRegistry

from configuration.settings import PROJECT_ROOT
from devstack.fake_provider import FakeProvider
from devstack.outcomes import outcomes
from tests.conftest import email_destination, unique_name
from tests.ports import free_port

EMAIL = {
    "senderAddress": "a@example.com",
    "recipients": {"to": [{"address": "b@example.com"}]},
    "content": {"subject": "Hello", "plainText": "Hi"},
}


def start_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as output:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, str(PROJECT_ROOT / "worker.py")],
            cwd=PROJECT_ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )


async def scrape(url: str) -> str:
    async with httpx.AsyncClient() as http:
        for _ in range(100):
            try:
                response = await http.get(url)
                if "temporal_" in response.text:
                    return response.text
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    return ""


def worker_env(dev_env: Any, tmp_path: Path, config: Path, task_queue: str) -> dict[str, str]:
    return {
        **os.environ,
        "TEMPORAL_ADDRESS": dev_env.client.service_client.config.target_host,
        "OUTBOX_CONFIG": str(config),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'readmodel.db'}",
        "WORKFLOW_TASK_QUEUE": task_queue,
        "WORKER_METRICS_ADDRESS": f"127.0.0.1:{free_port()}",
    }


def write_config(path: Path, destination: Any) -> None:
    settings = "\n".join(f'{key} = "{value}"' for key, value in destination.settings.items())
    bulk = f'mode = "bulk"\nshards = {destination.shards}\n' if destination.is_bulk else ""
    path.write_text(
        f"""[destinations.{destination.name}]
provider = "{destination.provider}"
{bulk}report_window_s = {destination.delivery.report_window_s}
submit_rate = {destination.submit_rate}
poll_rate = {destination.poll_rate}
poll_interval_s = {destination.delivery.poll_interval_s}
submit_timeout_s = {destination.delivery.submit_timeout_s}
backoff_initial_s = {destination.delivery.backoff_initial_s}
max_attempts = {destination.max_attempts}
[destinations.{destination.name}.flow]
throttle_pause = {str(destination.flow.throttle_pause).lower()}
breaker = {str(destination.flow.breaker).lower()}
{flow_caps(destination)}
[destinations.{destination.name}.settings]
{settings}
"""
    )


def flow_caps(destination: Any) -> str:
    """The destination's caps and quotas as TOML lines (`flowcontrol/caps.py`)."""
    flow, lines = destination.flow, []
    for field in ("max_in_flight", "key_max_in_flight"):
        if getattr(flow, field) is not None:
            lines.append(f"{field} = {getattr(flow, field)}")
    for field in ("quotas", "key_quotas"):
        quotas = ", ".join(f'{{per = "{q.per}", max = {q.max}}}' for q in getattr(flow, field))
        if quotas:
            lines.append(f"{field} = [{quotas}]")
    return "\n".join(lines)


async def assert_exactly_once(fake: FakeProvider, item_ids: list[str]) -> None:
    for item_id in item_ids:
        stats = await fake.admin.key_stats(provider_idempotency_key(item_id))
        assert stats["deliveries"] == 1, (item_id, stats)
        assert stats["early_requests"] == 0, (item_id, stats)


@pytest.mark.chaos
async def test_worker_killed_three_times_loses_and_duplicates_nothing(
    dev_env, fake_provider, tmp_path: Path
) -> None:
    destination = email_destination(
        fake_provider, submit_timeout_s=3, poll_interval_s=0.5, poll_backoff_multiplier=1
    )
    config = tmp_path / "destinations.toml"
    write_config(config, destination)
    task_queue = unique_name("workflows")
    env = worker_env(dev_env, tmp_path, config, task_queue)
    log = tmp_path / "worker.log"
    outbox = OutboxClient(
        dev_env.client, DestinationRegistry({destination.name: destination}), task_queue
    )
    await fake_provider.admin.set_faults(latency_ms=50)
    worker = start_worker(env, log)
    try:
        item_ids = [
            (await outbox.enqueue("chaos", destination.name, EMAIL, key=f"kill-{n}")).item_id
            for n in range(60)
        ]
        # The worker exports Temporal SDK metrics for Prometheus.
        metrics = await scrape(f"http://{env['WORKER_METRICS_ADDRESS']}/metrics")
        assert "temporal_" in metrics
        for _ in range(3):
            await asyncio.sleep(random.uniform(1.0, 2.5))
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            worker = start_worker(env, log)
        results = await outcomes(dev_env.client, item_ids)
    finally:
        await fake_provider.admin.set_faults()
        worker.terminate()
        worker.wait(timeout=30)

    assert set(results.values()) == {"sent"}, results
    await assert_exactly_once(fake_provider, item_ids)


@pytest.mark.chaos
async def test_provider_storm_ends_every_item_with_no_duplicate_or_early_retry(
    dev_env, stack_factory, fake_provider
) -> None:
    destination = email_destination(
        fake_provider,
        max_attempts=12,
        backoff_initial_s=0.2,
        backoff_max_s=2,
        poll_interval_s=0.3,
        poll_backoff_multiplier=1,
        settings={"timeout_s": 0.5},
        # A third of requests fail at random, one by one: not a destination that is down,
        # which the circuit breaker is for (tests/api/test_breaker.py).
        flow={"breaker": False},
    )
    stack = await stack_factory(destination, env=dev_env)
    await fake_provider.admin.set_faults(
        error_rate=0.3,
        throttle_rate=0.1,
        retry_after="1",
        timeout_rate=0.05,
        hang_s=1.0,
        # Sends taken whose answer is lost: the retry must be the same send, not a second one.
        lost_response_rate=0.05,
        running_polls=2,
        operation_fail_rate=0.1,
        seed=7,
    )
    try:
        items = [await stack.enqueue(destination, EMAIL, key=f"storm-{n}") for n in range(40)]
        results = await outcomes(stack.client, [item.item_id for item in items])
    finally:
        await fake_provider.admin.set_faults()

    assert set(results.values()) <= {"sent", "failed"}
    assert "sent" in results.values()
    for item in items:
        stats = await fake_provider.admin.key_stats(provider_idempotency_key(item.item_id))
        assert stats["deliveries"] <= 1 and stats["early_requests"] == 0, (item.item_id, stats)
        if results[item.item_id] == "sent":
            assert stats["deliveries"] == 1
