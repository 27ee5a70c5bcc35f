"""Fault injection at small scale: the Temporal dev server stopped and restarted mid-run on its
persistent SQLite file, and the API killed while clients enqueue over HTTP.

Both run the product as it is deployed (worker and API as child processes) and assert at the fake
provider's counters: every item ends `sent`, none is lost, none is delivered twice, no request
comes before a Retry-After elapsed, and no destination's rate is exceeded.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from durable_outbox_temporal import OutboxClient
from durable_outbox_temporal.contract.ids import item_workflow_id, provider_idempotency_key
from durable_outbox_temporal.destinations import Destination, DestinationRegistry
from temporalio.client import Client

from configuration.settings import PROJECT_ROOT
from devstack.dev import WORKER_READY_LINE
from devstack.fake_provider import FakeProvider, FaultConfig, run_fake_provider
from devstack.outcomes import outcomes
from devstack.temporal_server import DevServer, stop_process
from tests.conftest import email_destination, unique_name, webhook_destination
from tests.faults.test_faults import EMAIL, free_port, start_worker, write_config

# Every wait in these tests is bounded by this, so a lost item fails the test with a list of
# what is missing instead of a pytest timeout.
SETTLE_TIMEOUT_S = 90.0


def stack_env(address: str, tmp_path: Path, config: Path, task_queue: str) -> dict[str, str]:
    """Environment of the worker and API children: one server, one read model, one queue."""
    return {
        **os.environ,
        "TEMPORAL_ADDRESS": address,
        "OUTBOX_CONFIG": str(config),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'readmodel.db'}",
        "WORKFLOW_TASK_QUEUE": task_queue,
        "WORKER_METRICS_ADDRESS": f"127.0.0.1:{free_port()}",
        # Open API, whatever a developer's shell or .env says.
        "API_TOKEN": "",
        "PYTHONUNBUFFERED": "1",
    }


async def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def wait_for_worker(worker: subprocess.Popen[bytes], log: Path) -> None:
    """The worker logs its ready line once every poller runs (worker.py)."""

    def ready() -> bool:
        assert worker.poll() is None, log.read_text()
        return WORKER_READY_LINE in log.read_text(errors="replace")

    await wait_until(ready, 30, "the worker to be ready")


def assert_delivered_exactly_once(fake: FakeProvider, item_ids: list[str]) -> None:
    """Per key and in total: this fake serves one test, so any extra delivery is a duplicate."""
    expected = {provider_idempotency_key(item_id): item_id for item_id in item_ids}
    delivered = {key: stats.deliveries for key, stats in fake.state.keys.items()}
    wrong = {
        expected.get(key, f"unexpected key {key}"): delivered.get(key, 0)
        for key in set(expected) | set(delivered)
        if delivered.get(key, 0) != (1 if key in expected else 0)
    }
    assert not wrong, wrong
    early = {key: stats.early_requests for key, stats in fake.state.keys.items()}
    assert not any(early.values()), {expected.get(k, k): n for k, n in early.items() if n}


def assert_rate_held(fake: FakeProvider, path_prefix: str, rate: float) -> None:
    """The server's token bucket may burst about one second's worth on top of the steady rate
    (the bound tests/workflows/test_on_dev_server.py uses)."""
    window_s = 2.0
    seen = fake.state.max_in_window(path_prefix, window_s)
    assert seen <= rate * window_s + 2 * math.ceil(rate), (path_prefix, seen, rate)


def requests_since(fake: FakeProvider, since: float, path_prefix: str) -> int:
    return sum(
        1 for at, path in fake.state.requests if at >= since and path.startswith(path_prefix)
    )


SUBMIT_RATE = 10.0
POLL_RATE = 20.0
ITEMS = 100


@pytest.mark.timeout(150)
# The SIGTERM case runs in `make chaos` (`-m chaos`): it proves what the SIGKILL case proves with a
# gentler stop, and each case held a test process for 40-70 s of the suite's wall time
# (docs/decisions/parallel-tests.md).
@pytest.mark.parametrize(
    "stop_signal",
    [pytest.param(signal.SIGTERM, marks=pytest.mark.chaos), signal.SIGKILL],
    ids=["term", "kill"],
)
async def test_dev_server_restart_mid_run_loses_and_duplicates_nothing(
    tmp_path: Path, stop_signal: signal.Signals
) -> None:
    """Stop the server while items wait on submits, Retry-After timers and polls, start it again
    on the same SQLite file and port: the same worker process must reconnect by itself and
    finish every item, and the provider must see each item's key delivered once."""
    db_file = tmp_path / "temporal.db"
    port, ui_port = free_port(), free_port()
    task_queue = unique_name("workflows")
    # Latency keeps submits in flight; running polls keep operations open across the restart;
    # 429s with Retry-After put durable timers across it.
    faults = FaultConfig(
        latency_ms=100, running_polls=2, throttle_rate=0.1, retry_after="1", seed=5
    )
    async with run_fake_provider(faults) as fake, AsyncExitStack() as stack:
        destination = email_destination(
            fake,
            submit_rate=SUBMIT_RATE,
            poll_rate=POLL_RATE,
            poll_interval_s=0.5,
            submit_timeout_s=3,
            backoff_initial_s=0.5,
            max_attempts=20,
            # The 429s are each item's timers across the restart, not a throttle of the
            # destination: the rule would pause it at every tenth submit.
            flow={"throttle_pause": False},
        )
        config = tmp_path / "destinations.toml"
        write_config(config, destination)
        server_log = stack.enter_context((tmp_path / "temporal.log").open("ab"))
        first = await stack.enter_async_context(
            DevServer(db_file, port=port, ui_port=ui_port, output=server_log)
        )
        worker_log = tmp_path / "worker.log"
        worker = start_worker(stack_env(first.address, tmp_path, config, task_queue), worker_log)
        # In a thread: the fake provider serves from this event loop while the worker drains.
        stack.push_async_callback(asyncio.to_thread, stop_process, worker, 30)
        await wait_for_worker(worker, worker_log)
        client = await Client.connect(first.address)
        outbox = OutboxClient(
            client, DestinationRegistry({destination.name: destination}), task_queue
        )
        limit = asyncio.Semaphore(10)

        async def enqueue(n: int) -> str:
            async with limit:
                return (
                    await outbox.enqueue("restart", destination.name, EMAIL, key=f"r-{n}")
                ).item_id

        item_ids = await asyncio.gather(*(enqueue(n) for n in range(ITEMS)))

        def delivered() -> int:
            return sum(stats.deliveries for stats in fake.state.keys.values())

        await wait_until(lambda: delivered() >= ITEMS // 4, 30, "a quarter of the submits")
        accepted_at_stop = delivered()
        polling_at_stop = sum(1 for op in fake.state.operations.values() if op.polls_left > 0)
        assert first.process is not None
        if stop_signal == signal.SIGKILL:
            first.process.kill()
            first.process.wait()
        else:
            await asyncio.to_thread(first.stop)
        # Long enough for the worker's polls and completions to fail, and timers to come due
        # (Retry-After 1 s, backoff 0.5 s).
        await asyncio.sleep(1.5)
        restarted_at = time.monotonic()
        await stack.enter_async_context(
            DevServer(db_file, port=port, ui_port=ui_port, output=server_log)
        )
        statuses = await outcomes(client, item_ids, timeout_s=SETTLE_TIMEOUT_S)
        worker_alive = worker.poll() is None
        await asyncio.to_thread(stop_process, worker, 30)  # before the server it talks to

    # The restart fell in the middle of the run, not before or after it.
    assert ITEMS // 4 <= accepted_at_stop < ITEMS, accepted_at_stop
    assert polling_at_stop > 0
    assert requests_since(fake, restarted_at, "/emails:send") > 0
    assert requests_since(fake, restarted_at, "/emails/operations") > 0
    assert any(stats.not_before for stats in fake.state.keys.values()), "no Retry-After was sent"
    # Nobody restarted the worker: it reconnected to the new server process on its own.
    assert worker_alive, worker_log.read_text()
    not_sent = {item_id: status for item_id, status in statuses.items() if status != "sent"}
    assert not not_sent, not_sent
    assert_delivered_exactly_once(fake, item_ids)
    assert_rate_held(fake, "/emails:send", SUBMIT_RATE)
    assert_rate_held(fake, "/emails/operations", POLL_RATE)


class ApiProcess:
    """The API as production runs it, `uvicorn api.main:create_app --factory`, on a fixed port
    so a restarted process answers where clients already point."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env = env
        self.log = log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as output:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "api.main:create_app", "--factory"]
                + ["--host", "127.0.0.1", "--port", str(self.port)],
                cwd=PROJECT_ROOT,
                env=self.env,
                stdout=output,
                stderr=subprocess.STDOUT,
            )

    async def wait_until_healthy(self, http: httpx.AsyncClient) -> None:
        deadline = time.monotonic() + 30
        while True:
            assert self.process is not None and self.process.poll() is None, self.log.read_text()
            with contextlib.suppress(httpx.TransportError):
                if (await http.get(f"{self.url}/healthz")).status_code == 200:
                    return
            assert time.monotonic() < deadline, "the API did not start in 30 s"
            await asyncio.sleep(0.05)

    async def kill(self) -> None:
        """SIGKILL, after freezing the process long enough for Temporal to finish the starts it
        already sent: their workflows exist, but their answers never leave."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        await asyncio.sleep(0.3)
        self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process, 10)


@dataclass
class Enqueued:
    """What one client saw for one key: its final 2xx (if any) and what it retried through."""

    key: str
    status: int | None = None
    connection_errors: int = 0
    server_errors: int = 0
    refused: str | None = None


async def enqueue_until_answered(
    http: httpx.AsyncClient, url: str, body: dict[str, Any], key: str
) -> Enqueued:
    """A well-behaved client: retry connection errors and 5xx with the same Idempotency-Key."""
    seen = Enqueued(key)
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            response = await http.post(url, json=body, headers={"Idempotency-Key": key})
        except httpx.TransportError:
            seen.connection_errors += 1
        else:
            if response.is_success:
                seen.status = response.status_code
                return seen
            if response.status_code < 500:
                seen.refused = f"{response.status_code} {response.text}"
                return seen
            seen.server_errors += 1
        await asyncio.sleep(0.05)
    return seen


API_CLIENTS = 5
KEYS_PER_CLIENT = 20


@pytest.mark.timeout(150)
async def test_api_killed_while_clients_enqueue_loses_no_answered_item(
    dev_env, tmp_path: Path
) -> None:
    """SIGKILL the API twice while clients enqueue: a request in flight at the kill may have
    started its workflow without an answer, so the client's retry must find that item (200), not
    make a second one; and every key that got a 2xx must exist afterwards and be delivered once."""
    outbox_name = unique_name("api-restart")
    task_queue = unique_name("workflows")
    address = dev_env.client.service_client.config.target_host
    async with run_fake_provider() as fake, AsyncExitStack() as stack:
        destination: Destination = webhook_destination(fake, submit_rate=50.0)
        config = tmp_path / "destinations.toml"
        write_config(config, destination)
        env = stack_env(address, tmp_path, config, task_queue)
        worker_log = tmp_path / "worker.log"
        worker = start_worker(env, worker_log)
        stack.push_async_callback(asyncio.to_thread, stop_process, worker, 30)
        # Before the API, so the two processes do not race to create the read-model schema.
        await wait_for_worker(worker, worker_log)
        api = ApiProcess(env, tmp_path / "api.log")
        api.start()
        stack.push_async_callback(asyncio.to_thread, api.stop)
        http = await stack.enter_async_context(httpx.AsyncClient(timeout=10))
        await api.wait_until_healthy(http)

        items_url = f"{api.url}/v1/outboxes/{outbox_name}/items"
        answered: list[Enqueued] = []

        async def client(number: int) -> None:
            for n in range(KEYS_PER_CLIENT):
                body = {"destination": destination.name, "payload": {"client": number, "n": n}}
                answered.append(
                    await enqueue_until_answered(http, items_url, body, f"c{number}-{n}")
                )

        async def killer() -> None:
            total = API_CLIENTS * KEYS_PER_CLIENT
            for fraction in (0.25, 0.6):
                await wait_until(lambda f=fraction: len(answered) >= total * f, 30, "enqueues")
                await api.kill()
                api.start()
                await api.wait_until_healthy(http)

        await asyncio.gather(killer(), *(client(number) for number in range(API_CLIENTS)))
        keys = [outcome.key for outcome in answered]
        item_ids = [item_workflow_id(outbox_name, key) for key in keys]
        statuses = await outcomes(dev_env.client, item_ids, timeout_s=SETTLE_TIMEOUT_S)
        api_views = {}
        for key in keys:
            response = await http.get(f"{items_url}/{key}")
            api_views[key] = (response.status_code, response.json().get("status"))
        query = f"OutboxName = '{outbox_name}'"
        listed: set[str] = set()
        for _ in range(100):  # visibility is eventually consistent
            listed = {execution.id async for execution in dev_env.client.list_workflows(query)}
            if len(listed) >= len(item_ids):
                break
            await asyncio.sleep(0.1)

    assert len(answered) == API_CLIENTS * KEYS_PER_CLIENT
    # The kills hit live traffic: clients saw the API go away and retried through it.
    assert sum(outcome.connection_errors for outcome in answered) > 0
    # ...and some requests were in flight at a kill: the item existed, only the answer was lost.
    assert any(outcome.status == 200 and outcome.connection_errors for outcome in answered)
    unanswered = [outcome for outcome in answered if outcome.status is None]
    assert not unanswered, unanswered
    assert {outcome.status for outcome in answered} <= {200, 202}
    not_sent = {item_id: status for item_id, status in statuses.items() if status != "sent"}
    assert not not_sent, not_sent
    assert set(api_views.values()) == {(200, "sent")}, api_views
    # One workflow per key: no retry created a second item.
    assert listed == set(item_ids)
    assert_delivered_exactly_once(fake, item_ids)
