"""The backup-and-restore drill of docs/how-to/backup-and-restore.md, on PostgreSQL and the dev
server: items flow, the read model is dumped with `pg_dump`, the stack goes on for a while (an
item sent, a relay row relayed), then the read model is lost and restored with `pg_restore`
into a fresh database, and a stack on the restored database takes over. It still answers a key
sent before the dump (200, never sent again) even once Temporal's retention has deleted its
workflow, and one sent after it (Temporal still has that item), serves the aggregate event
store as it was, and relays each unsent relay row once, including the one relayed after the
dump, which the restored database holds as pending again.

Marked `chaos` (run by `make chaos`, not `make test`): the dev server deletes a workflow, as
retention would, in the background, which takes it 15 to 40 s of wall clock, so the drill runs
30 to 60 s.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from durable_outbox_temporal.aggregates import AggregateClient
from durable_outbox_temporal.contract.ids import item_workflow_id
from durable_outbox_temporal.contract.item import ItemStatus, NewItem
from durable_outbox_temporal.transactional import enqueue_in
from sqlalchemy import Engine, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import DeleteWorkflowExecutionRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from readmodel import aggregates as event_store
from readmodel.db import create_schema, make_engine
from readmodel.models import OUTBOX_PENDING
from service.items import ItemService
from service.relay import Relay
from tests.conftest import SEED_TYPES, TrackingOutboxClient, webhook_destination
from tests.fakes import deliveries
from tests.readmodel.conftest import POSTGRES_URL
from worker import build_workers

PAYLOAD = {"hello": "drill"}


def pg_tool(name: str, admin: Engine) -> str:
    """`pg_dump` or `pg_restore` of the server's major version where installed side by side
    (a client older than the server refuses to dump it), else the one on PATH."""
    with admin.connect() as connection:
        major = int(connection.execute(text("SHOW server_version_num")).scalar_one()) // 10000
    matching = Path(f"/usr/lib/postgresql/{major}/bin/{name}")
    found = str(matching) if matching.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found: install the PostgreSQL {major} client")
    return found


@pytest.fixture
def databases() -> Iterator[tuple[str, str]]:
    """Two fresh databases on the test server, the original and the one restored into;
    dropped afterwards."""
    admin = make_engine(POSTGRES_URL).execution_options(isolation_level="AUTOCOMMIT")
    run = uuid.uuid4().hex[:10]
    names = (f"drill_{run}_original", f"drill_{run}_restored")
    with admin.connect() as connection:
        for name in names:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(POSTGRES_URL)
    try:
        yield tuple(  # type: ignore[misc]
            url.set(database=name).render_as_string(hide_password=False) for name in names
        )
    finally:
        with admin.connect() as connection:
            for name in names:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def engine(databases: tuple[str, str]) -> Iterator[Engine]:
    """The original read model: the stack the drill starts with writes here."""
    engine = make_engine(databases[0])
    create_schema(engine, SEED_TYPES.migrations)
    yield engine
    engine.dispose()


def libpq_url(url: str) -> str:
    """The SQLAlchemy URL as `pg_dump` and `pg_restore` take it."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def forget_in_temporal(client: Client, workflow_id: str) -> None:
    """Delete a closed workflow as the namespace's retention would, and wait until it is gone."""
    await client.workflow_service.delete_workflow_execution(
        DeleteWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=workflow_id),
        )
    )
    for _ in range(1200):
        try:
            await client.get_workflow_handle(workflow_id).describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return
            raise
        await asyncio.sleep(0.05)
    raise AssertionError(f"{workflow_id} was never deleted")


async def run_tool(*command: str) -> None:
    """Run a PostgreSQL client tool as the how-to does; its output names what failed."""
    done = await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


def relay_row(engine: Engine, destination: str, key: str) -> None:
    with Session(engine) as session, session.begin():
        enqueue_in(session, outbox="drill", destination=destination, payload=PAYLOAD, key=key)


@pytest.mark.chaos
async def test_a_read_model_restored_from_a_dump_takes_over(
    stack_factory: Any,
    fake_provider: Any,
    dev_env: Any,
    engine: Engine,
    databases: tuple[str, str],
    tmp_path: Path,
) -> None:
    destination = webhook_destination(fake_provider)
    stack = await stack_factory(destination, env=dev_env)
    items = ItemService(stack.outbox, engine)
    aggregates = AggregateClient(stack.client, stack.task_queue, definitions=SEED_TYPES.definitions)
    run = uuid.uuid4().hex[:8]
    before, after = f"before-{run}", f"after-{run}"
    relayed_after_dump, never_relayed = f"relay-a-{run}", f"relay-b-{run}"
    flight = f"BA{run}"

    # Items flowing, an aggregate with events, two relay rows not yet relayed.
    await items.enqueue("drill", NewItem(destination.name, PAYLOAD, before))
    assert (await stack.result(item_workflow_id("drill", before))).status == "sent"
    # Temporal's retention deletes that item (the server takes some seconds; meanwhile the
    # drill goes on): then the read model is the only memory of its key.
    forgotten = asyncio.create_task(
        forget_in_temporal(stack.client, item_workflow_id("drill", before))
    )
    await aggregates.command("flight", flight, "open", {"seats": ["1A", "2B"]})
    await aggregates.command("flight", flight, "assign_seat", {"seat": "1A", "passenger_id": "p1"})
    for _ in range(100):
        if len(event_store.events(engine, "flight", flight)) == 2:
            break
        await asyncio.sleep(0.05)
    stored = event_store.events(engine, "flight", flight)
    assert len(stored) == 2
    relay_row(engine, destination.name, relayed_after_dump)
    relay_row(engine, destination.name, never_relayed)

    dump = tmp_path / "readmodel.dump"
    admin = make_engine(POSTGRES_URL)
    await run_tool(
        pg_tool("pg_dump", admin),
        "--format=custom",
        "--no-owner",
        f"--file={dump}",
        libpq_url(databases[0]),
    )

    # The stack goes on after the dump: one more item, and one relay row relayed.
    await items.enqueue("drill", NewItem(destination.name, PAYLOAD, after))
    assert (await stack.result(item_workflow_id("drill", after))).status == "sent"
    with engine.begin() as connection:
        connection.execute(
            OUTBOX_PENDING.update()
            .where(OUTBOX_PENDING.c.key == never_relayed)
            .values(claimed_until=text("now() + interval '1 hour'"))
        )
    assert await Relay(stack.outbox, engine).relay_once() == 1
    relayed_id = item_workflow_id("drill", relayed_after_dump)
    assert (await stack.result(relayed_id)).status == "sent"

    await forgotten
    # The read model is lost: its workers stop, and it comes back from the dump.
    await stack.workers.aclose()
    await run_tool(
        pg_tool("pg_restore", admin),
        "--no-owner",
        "--exit-on-error",
        f"--dbname={libpq_url(databases[1])}",
        str(dump),
    )
    admin.dispose()
    restored = make_engine(databases[1])
    create_schema(restored, SEED_TYPES.migrations)  # at head already: nothing to do
    try:
        async with httpx.AsyncClient() as http_client, AsyncExitStack() as workers:
            for worker in build_workers(
                stack.client,
                destinations=[destination],
                http_client=http_client,
                engine=restored,
                workflow_task_queue=stack.task_queue,
                sandboxed=True,
                aggregate_types=SEED_TYPES,
            ):
                await workers.enter_async_context(worker)
            outbox = TrackingOutboxClient(stack.client, stack.outbox.destinations, stack.task_queue)
            again = ItemService(outbox, restored)

            for key in (before, after):
                repeated = await again.enqueue("drill", NewItem(destination.name, PAYLOAD, key))
                assert not repeated.result.created, key
                assert repeated.status is ItemStatus.SENT, key
            assert event_store.events(restored, "flight", flight) == stored
            assert await Relay(outbox, restored).relay_once() == 2
            never_id = item_workflow_id("drill", never_relayed)
            assert (await stack.result(never_id)).status == "sent"
            with restored.connect() as connection:
                statuses = connection.execute(
                    select(OUTBOX_PENDING.c.status).order_by(OUTBOX_PENDING.c.key)
                ).scalars()
                assert list(statuses) == ["relayed", "relayed"]
            for key in (before, after, relayed_after_dump, never_relayed):
                assert await deliveries(fake_provider, item_workflow_id("drill", key)) == 1, key
    finally:
        restored.dispose()
