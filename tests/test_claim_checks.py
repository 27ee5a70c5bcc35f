"""Claim checks: a payload near the 10 MiB request limit goes through the API, the workflow and
the provider intact, while the workflow history carries a reference and the blob is stored once
(encrypted) in the database; a repeated request stores nothing more, and the blobs of workflows
Temporal no longer has are pruned, a long-lived workflow's run by run."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import httpx
from durable_outbox_temporal.codec import EncryptionCodec, data_converter, new_key_setting
from sqlalchemy import func, select
from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.converter import StorageDriverStoreContext, StorageDriverWorkflowInfo
from temporalio.worker import Worker

from api.main import create_app
from readmodel.models import PAYLOAD_BLOBS
from readmodel.payload_store import (
    SqlPayloadStore,
    claim_checks,
    prune_orphaned_blobs,
    temporal_runs,
)
from tests.api.conftest import api_settings
from tests.conftest import unique_name, webhook_destination
from tests.fakes import deliveries

LIMIT = 10 * 1024 * 1024


async def test_a_large_payload_is_stored_once_and_referenced(
    time_skipping_env, stack_factory, fake_provider, engine, monkeypatch
) -> None:
    key_setting = new_key_setting("cc-1")
    monkeypatch.setenv("PAYLOAD_KEYS", key_setting)
    converter = data_converter(
        EncryptionCodec.from_setting(key_setting), claim_checks(engine, 64 * 1024)
    )
    client = Client(**{**time_skipping_env.client.config(), "data_converter": converter})
    destination = webhook_destination(fake_provider)
    stack = await stack_factory(destination, client=client)
    settings = api_settings(workflow_task_queue=stack.task_queue)
    assert settings.max_request_bytes == LIMIT  # the default, with claim checks on
    app = create_app(settings, outbox_client=stack.outbox, engine=engine)
    blob = "x" * (LIMIT - 4096)  # the request's JSON around it stays under the limit
    key = unique_name("big")
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            response = await http.post(
                "/v1/outboxes/tests/items",
                json={"destination": destination.name, "payload": {"blob": blob}},
                headers={"Idempotency-Key": key},
            )
            assert response.status_code == 202, response.text[:500]
            view = await stack.result(response.json()["id"])
            too_big = await http.post(
                "/v1/outboxes/tests/items",
                json={"destination": destination.name, "payload": {"blob": blob + "x" * 8192}},
            )

    assert view.status == "sent"
    assert await deliveries(fake_provider, view.id) == 1
    received = await fake_provider.admin.deliveries(destination.name)
    assert any(entry["payload"].get("blob") == blob for entry in received)
    history = await client.get_workflow_handle(view.id).fetch_history()
    assert len(history.to_json()) < 200_000  # the 10 MiB are not in the history
    with engine.connect() as connection:
        stored = connection.execute(select(func.count(), func.max(PAYLOAD_BLOBS.c.size))).one()
        raw = connection.execute(select(PAYLOAD_BLOBS.c.data)).scalars().all()
    assert stored[0] >= 1 and stored[1] > LIMIT // 2
    assert all(b"xxxxxxxxxxxxxxxx" not in data for data in raw)  # stored encrypted
    assert too_big.status_code == 413


async def test_a_repeated_request_stores_its_large_payload_once(
    time_skipping_env, stack_factory, fake_provider, engine, monkeypatch
) -> None:
    key_setting = new_key_setting("cc-2")
    monkeypatch.setenv("PAYLOAD_KEYS", key_setting)
    # Encrypted with a fresh nonce each time: two starts of one payload are two distinct blobs.
    converter = data_converter(
        EncryptionCodec.from_setting(key_setting), claim_checks(engine, 64 * 1024)
    )
    client = Client(**{**time_skipping_env.client.config(), "data_converter": converter})
    destination = webhook_destination(fake_provider)
    stack = await stack_factory(destination, client=client)
    app = create_app(
        api_settings(workflow_task_queue=stack.task_queue),
        outbox_client=stack.outbox,
        engine=engine,
    )
    body = {
        "destination": destination.name,
        "payload": {"blob": "y" * 200 * 1024},
        "delay_seconds": 3600,  # still queued while the repeats come
    }
    key = unique_name("again")
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            answers = [
                await http.post(
                    "/v1/outboxes/tests/items", json=body, headers={"Idempotency-Key": key}
                )
                for _ in range(10)
            ]

    assert [answer.status_code for answer in answers] == [202] + [200] * 9
    assert {answer.json()["status"] for answer in answers} == {"queued"}
    with engine.connect() as connection:
        owners = connection.execute(select(PAYLOAD_BLOBS.c.workflow_id)).scalars().all()
    assert owners == [answers[0].json()["id"]]  # one blob, the item's (pruned once it is gone)


async def test_blobs_of_workflows_temporal_no_longer_has_are_pruned(
    dev_env, stack_factory, fake_provider, engine
) -> None:
    # The dev server: its clock is the wall's, as the pruner's times are (a time-skipping
    # server's runs start in its own skipped-ahead time).
    store = SqlPayloadStore(engine)
    client = dev_env.client
    destination = webhook_destination(fake_provider)
    stack = await stack_factory(destination, env=dev_env)
    live = await stack.enqueue(destination, {"n": 1})
    await stack.result(live.item_id)

    def payload(text: str) -> Payload:
        return Payload(metadata={"encoding": b"json/plain"}, data=text.encode())

    def stored_for(workflow_id: str | None) -> StorageDriverStoreContext:
        target = None
        if workflow_id is not None:
            target = StorageDriverWorkflowInfo(namespace=client.namespace, id=workflow_id)
        return StorageDriverStoreContext(target=target)

    # One blob of a workflow that exists, one of a start that never happened (Temporal no longer
    # has it either way), one two workflows share, and one stored for no workflow.
    await store.store(stored_for(live.item_id), [payload('"live"')])
    await store.store(stored_for("outbox/tests/never-started"), [payload('"orphan"')])
    await store.store(stored_for("outbox/tests/gone-1"), [payload('"shared"')])
    await store.store(stored_for(live.item_id), [payload('"shared"')])
    await store.store(stored_for(None), [payload('"unowned"')])

    kept_young = await prune_orphaned_blobs(engine, temporal_runs(client))
    # One workflow asked about at a time: the pruner pages through them all.
    pruned = await prune_orphaned_blobs(engine, temporal_runs(client), grace=timedelta(0), batch=1)

    with engine.connect() as connection:
        left = connection.execute(select(PAYLOAD_BLOBS.c.data, PAYLOAD_BLOBS.c.workflow_id)).all()
    owners = {Payload.FromString(row.data).data.decode(): row.workflow_id for row in left}
    assert (kept_young, pruned) == (0, 1)
    assert owners == {'"live"': live.item_id, '"shared"': None, '"unowned"': None}


@workflow.defn(name="tests.ContinuedRuns", sandboxed=False)
class ContinuedRuns:
    @workflow.run
    async def run(self, left: int) -> None:
        if left:
            workflow.continue_as_new(left - 1)


async def test_temporal_runs_finds_a_continued_workflows_runs_on_the_dev_server(dev_env) -> None:
    client = dev_env.client
    task_queue = unique_name("runs")
    workflow_id = f"tests/continued/{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=task_queue, workflows=[ContinuedRuns]):
        await client.execute_workflow(ContinuedRuns.run, 2, id=workflow_id, task_queue=task_queue)
    query = f'WorkflowId = "{workflow_id}"'
    for _ in range(100):
        starts = [run.start_time async for run in client.list_workflows(query)]
        if len(starts) == 3:
            break
        await asyncio.sleep(0.1)
    runs = temporal_runs(client)

    current = await runs.current_start(workflow_id)

    assert len(starts) == 3 and current == max(starts)
    first = min(starts)
    assert await runs.started_by(workflow_id, first)
    assert not await runs.started_by(workflow_id, first - timedelta(milliseconds=1))
    assert await runs.current_start("tests/never-started") is None
    assert not await runs.started_by("tests/never-started", datetime.now(UTC))
    # An id no query can name keeps its blobs.
    assert await runs.started_by('tests/"quoted"', datetime.now(UTC))
