"""Exactly-once evidence for the process manager: the worker dies after an effect's activity
enqueued the outbox item and before the ledger heard of it. The retried execution on the next
worker finds the same item (its key is the effect's key): one item, one delivery."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from durable_outbox_temporal.aggregates import AggregateClient
from durable_outbox_temporal.contract.ids import item_workflow_id, provider_idempotency_key
from temporalio.client import WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.service import RPCError

from configuration.settings import PROJECT_ROOT
from examples.labour.domainmodel import EMAIL_DESTINATION, NOTIFICATIONS_OUTBOX
from readmodel import store
from readmodel.db import make_engine
from tests.conftest import SEED_TYPES, email_destination, unique_name
from tests.faults.test_faults import start_worker, worker_env, write_config


def start_killing_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.faults.effect_kill_worker"],
            cwd=PROJECT_ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )


async def test_worker_killed_between_an_effect_and_its_ledger_enqueues_once(
    dev_env, fake_provider, tmp_path: Path
) -> None:
    destination = email_destination(fake_provider, name=EMAIL_DESTINATION, poll_interval_s=0.5)
    config = tmp_path / "destinations.toml"
    write_config(config, destination)
    task_queue = unique_name("workflows")
    env = {
        **worker_env(dev_env, tmp_path, config, task_queue),
        "OPERATIONS_TASK_QUEUE": f"{task_queue}-operations",
    }
    client = AggregateClient(
        dev_env.client,
        task_queue,
        definitions=SEED_TYPES.definitions,
        operations_task_queue=env["OPERATIONS_TASK_QUEUE"],
    )
    labour = unique_name("labour")
    log = tmp_path / "worker.log"

    async def run(command: str, **payload: Any) -> None:
        # As a caller should after an ambiguous timeout (a loaded machine's server answered one
        # in a CI run): the same command again, under its id, is answered as a duplicate.
        for attempt in range(3):
            try:
                await client.command("labour", labour, command, payload, command_id=command)
                return
            except (RPCError, WorkflowUpdateRPCTimeoutOrCancelledError):
                if attempt == 2:
                    raise

    worker = start_killing_worker(env, log)
    try:
        await run("plan_labour", actor="m1", mother_name="Ada", contact={"email": "a@x.io"})
        token = None
        while token is None:  # the token policy's command (not an enqueue) runs unharmed
            token = (await client.state("labour", labour)).state["subscription_token"]
            await asyncio.sleep(0.1)
        await run("request_access", actor="s1", token=token, name="Bo", contact={"email": "b@x.io"})
        await run("approve_subscriber", actor="m1", subscriber="s1", role="observer")
        await run("post_update", actor="m1", message="It's a boy!", kind="announcement")

        killed = await asyncio.to_thread(worker.wait, 60)
        assert killed == -signal.SIGKILL, log.read_text()[-3000:]
        assert "killed after effect" in log.read_text()
        worker = start_worker(env, log)
        # The execution in flight at the kill times out (15 s) and runs again on this worker.
        for _ in range(600):
            await asyncio.sleep(0.1)
            try:
                [_, notify] = await client.effects("labour", labour)
            except RPCError:  # a query in flight to the killed worker's sticky queue
                continue
            if notify.status != "pending":
                break
        item_id = item_workflow_id(NOTIFICATIONS_OUTBOX, notify.key)
        engine = make_engine(env["DATABASE_URL"])
        status = None
        for _ in range(600):  # sent; the item then waits for delivery reports
            record = store.get_item(engine, item_id)
            status = record.view.status if record else None
            if status in ("sent", "failed"):
                break
            await asyncio.sleep(0.1)
    finally:
        worker.terminate()
        await asyncio.to_thread(worker.wait, 30)

    # The ledger ran the effect once; its retried activity found the item the killed one made.
    assert notify.status == "done" and notify.executions == 1, notify
    assert notify.result == {"item_id": item_id, "created": False}
    assert status == "sent", log.read_text()[-3000:]
    try:
        items, _ = store.list_items(engine, NOTIFICATIONS_OUTBOX)
    finally:
        engine.dispose()
    assert [i.view.id for i in items if labour in i.view.id] == [item_id]
    stats = await fake_provider.admin.key_stats(provider_idempotency_key(item_id))
    assert (stats["submits"], stats["deliveries"]) == (1, 1), stats
