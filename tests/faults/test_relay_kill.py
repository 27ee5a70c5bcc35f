"""A relay process SIGKILLed between enqueueing a committed row and marking it: the next relay
finds the item already there, and the provider gets it once."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from durable_outbox_temporal.contract.ids import item_workflow_id
from durable_outbox_temporal.transactional import enqueue_in
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from configuration.settings import PROJECT_ROOT
from readmodel.models import OUTBOX_PENDING
from service.relay import Relay
from tests.conftest import unique_name, webhook_destination
from tests.fakes import deliveries


async def test_a_relay_killed_before_marking_leaves_exactly_one_item(
    time_skipping_env, stack_factory, fake_provider, engine, tmp_path: Path
) -> None:
    destination = webhook_destination(fake_provider)
    stack = await stack_factory(destination)
    key = unique_name("killed")
    with Session(engine) as session, session.begin():
        enqueue_in(session, outbox="tests", destination=destination.name, payload={}, key=key)
    config = tmp_path / "destinations.toml"
    url = destination.settings["url"]
    config.write_text(
        f'[destinations.{destination.name}]\nprovider = "webhook"\nreport_window_s = 0\n'
        f'[destinations.{destination.name}.settings]\nurl = "{url}"\n'
        f'secret = "{destination.settings["secret"]}"\n'
    )
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": time_skipping_env.client.service_client.config.target_host,
        "TEMPORAL_NAMESPACE": time_skipping_env.client.namespace,
        "DATABASE_URL": str(engine.url.render_as_string(hide_password=False)),
        "OUTBOX_CONFIG": str(config),
        "WORKFLOW_TASK_QUEUE": stack.task_queue,
        "PAYLOAD_KEYS": "",
    }
    relay = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.faults.relay_kill",
        env=env,
        cwd=PROJECT_ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(relay.communicate(), timeout=60)
    assert relay.returncode == -signal.SIGKILL, output.decode()[-2000:]
    with engine.connect() as connection:
        assert connection.execute(select(OUTBOX_PENDING.c.status)).scalars().all() == ["pending"]

    # Its lease runs out (30 s; here at once) and a live relay takes the row.
    with engine.begin() as connection:
        connection.execute(
            update(OUTBOX_PENDING).values(claimed_until=datetime.now(UTC) - timedelta(seconds=1))
        )
    assert await Relay(stack.outbox, engine).relay_once() == 1

    item_id = item_workflow_id("tests", key)
    assert (await stack.result(item_id)).status == "sent"
    assert await deliveries(fake_provider, item_id) == 1
    with engine.connect() as connection:
        assert connection.execute(select(OUTBOX_PENDING.c.status)).scalars().all() == ["relayed"]
