"""Claim checks: a payload near the 10 MiB request limit goes through the API, the workflow and
the provider intact, while the workflow history carries a reference and the blob is stored once
(encrypted) in the database."""

from __future__ import annotations

import httpx
from sqlalchemy import func, select
from temporalio.client import Client

from api.main import create_app
from common.codec import EncryptionCodec, data_converter, new_key_setting
from readmodel.models import PAYLOAD_BLOBS
from readmodel.payload_store import claim_checks
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
