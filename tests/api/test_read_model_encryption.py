"""Issue 40's own finding, turned round: with payload keys, an email, a webhook and an aggregate
command each carrying a unique marker leave no marker in plain text in the read model's files,
while the API still answers each with its data; a value whose key is gone is a 503 problem
naming the key (without keys, `/readyz` lists the read model under `insecure`:
tests/api/test_security.py)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from durable_outbox_temporal.codec import EncryptionCodec, new_key_setting
from durable_outbox_temporal.contract.sealed_columns import keys_of, seal_with
from sqlalchemy import Engine

from tests.api.conftest import Api
from tests.api.test_aggregates import flight_url
from tests.api.test_items import assert_problem

KEYS = new_key_setting("k1")


def database_bytes(engine: Engine) -> bytes:
    """The SQLite file and its write-ahead log, as the disk holds them."""
    database = engine.url.database
    assert database
    return b"".join(
        Path(path).read_bytes() for path in (database, f"{database}-wal") if Path(path).exists()
    )


async def test_markers_are_sealed_at_rest_and_served_plain(api_factory, monkeypatch) -> None:
    monkeypatch.setenv("PAYLOAD_KEYS", KEYS)
    monkeypatch.delenv("PAYLOAD_KEYS_FILE", raising=False)
    api: Api = await api_factory()
    http = api.http
    marker = f"m{uuid.uuid4().hex}"
    address = f"{marker}@example.com"
    email = {
        "senderAddress": "noreply@example.com",
        "recipients": {"to": [{"address": address}]},
        "content": {"subject": f"subject {marker}", "plainText": "Hello"},
    }
    flight = f"BA{uuid.uuid4().hex[:6]}"

    sent = await http.post(
        "/v1/outboxes/sec/items",
        json={"destination": api.email.name, "payload": email},
        headers={"Idempotency-Key": "mail"},
    )
    hooked = await http.post(
        "/v1/outboxes/sec/items",
        json={"destination": api.webhook.name, "payload": {"field": marker}},
        headers={"Idempotency-Key": "hook"},
    )
    await http.post(flight_url(flight, "open"), json={"seats": ["1A"]})
    seated = await http.post(
        flight_url(flight, "assign_seat"), json={"seat": "1A", "passenger_id": marker}
    )
    assert (sent.status_code, hooked.status_code, seated.status_code) == (202, 202, 200)
    await api.stack.result(sent.json()["id"])
    await api.stack.result(hooked.json()["id"])

    assert marker.encode() not in database_bytes(api.stack.engine)
    mail = (await http.get("/v1/outboxes/sec/items/mail")).json()
    assert mail["status"] == "sent" and mail["payload"] == email
    listed = (await http.get("/v1/outboxes/sec/items?status=sent")).json()["items"]
    assert {item["key"]: item["payload"] for item in listed}["hook"] == {"field": marker}
    events = (await http.get("/v1/outboxes/sec/items/hook/events")).json()
    assert [event["type"] for event in events][-1] == "sent"
    # The worker writes its attempt log in batches after the requests: wait for the row.
    for _ in range(200):
        attempts = (await http.get("/v1/outboxes/sec/items/hook/attempts")).json()
        if attempts["attempts"]:
            break
        await asyncio.sleep(0.05)
    assert attempts["attempts"][0]["response"]["status"] == 204  # the fake webhook's answer
    history = (await http.get(f"{flight_url(flight)}/events")).json()
    assert history[-1]["data"]["passenger_id"] == marker
    state = (await http.get(flight_url(flight))).json()
    assert marker in str(state["state"])
    ready = (await http.get("/readyz")).json()
    assert not any("read model" in reason for reason in ready.get("insecure", []))

    # The API loses the key the rows were sealed with: a clear problem, never a 500.
    other = EncryptionCodec.from_setting(new_key_setting("k9"))
    sealed_with_k1 = keys_of(api.stack.engine)
    seal_with(api.stack.engine, other.value_keys())
    try:
        missing = assert_problem(await http.get("/v1/outboxes/sec/items/mail"), 503)
    finally:
        seal_with(api.stack.engine, sealed_with_k1)
    assert missing["code"] == "payload-key-missing" and missing["key_id"] == "k1"
    assert "'k1'" in missing["detail"]
