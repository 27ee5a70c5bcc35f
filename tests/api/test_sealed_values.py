"""Rotation through the API: with a new key in front, `GET /v1/sealed-values` counts the values
still under the old one, `sealed-values:reseal` answers 202 at once with a batch whose status URL
shows it walk to its end, after which the old key seals nothing and can go; bad requests are
problems (no keys: 409; an unknown batch: 404). The page's own rules:
`tests/readmodel/test_reseal.py`."""

from __future__ import annotations

import uuid
from typing import Any

from durable_outbox_temporal.codec import EncryptionCodec, new_key_setting
from durable_outbox_temporal.contract.reseal import reseal_batch_workflow_id
from durable_outbox_temporal.contract.sealed_columns import keys_of, seal_with

from tests.api.conftest import Api
from tests.api.test_items import assert_problem
from tests.api.test_purge import batch_end

K1_SETTING = new_key_setting("k1")
K2_SETTING = new_key_setting("k2")


async def test_a_reseal_batch_leaves_nothing_under_the_old_key(
    api_factory: Any, monkeypatch: Any
) -> None:
    monkeypatch.setenv("PAYLOAD_KEYS", K1_SETTING)
    monkeypatch.delenv("PAYLOAD_KEYS_FILE", raising=False)
    api: Api = await api_factory()
    http, engine = api.http, api.stack.engine
    sent = await http.post(
        "/v1/outboxes/keys/items",
        json={"destination": api.webhook.name, "payload": {"field": uuid.uuid4().hex}},
        headers={"Idempotency-Key": "hook"},
    )
    assert sent.status_code == 202, sent.text
    await api.stack.result(sent.json()["id"])
    under_k1 = (await http.get("/v1/sealed-values")).json()
    assert under_k1["current_key"] == "k1" and under_k1["keys"]["k1"] > 0

    # The API and the worker restarted with k2 in front of k1 (they share the engine here).
    seal_with(engine, EncryptionCodec.from_setting(f"{K2_SETTING},{K1_SETTING}").value_keys())
    before = (await http.get("/v1/sealed-values")).json()
    assert before["current_key"] == "k2"
    assert before["keys"]["k1"] == under_k1["keys"]["k1"]

    started = await http.post("/v1/sealed-values:reseal")
    assert started.status_code == 202, started.text
    body = started.json()
    assert (
        started.headers["location"] == body["links"]["self"] == f"/v1/reseal-batches/{body['id']}"
    )
    assert (body["state"], body["key_id"], body["done"]) == ("running", "k2", False)
    end = (await batch_end(http, body["links"]["self"]))[-1]

    assert (end["state"], end["done"], end["failure"]) == ("completed", True, None)
    assert end["resealed"] == before["keys"]["k1"] + before["plain"]
    assert end["unreadable"] == 0 and end["table"] is None
    assert "outbox_items" in end["tables_done"]
    after = (await http.get("/v1/sealed-values")).json()
    assert after == {
        "current_key": "k2",
        "keys": {"k2": before["keys"]["k2"] + end["resealed"], "k1": 0},
        "other": 0,
        "plain": 0,
    }
    # k1 removed: the item still reads.
    seal_with(engine, EncryptionCodec.from_setting(K2_SETTING).value_keys())
    item = (await http.get("/v1/outboxes/keys/items/hook")).json()
    assert item["status"] == "sent" and "field" in item["payload"]
    await api.stack.record_history(reseal_batch_workflow_id(body["id"]))


async def test_reseal_problems(api_factory: Any, monkeypatch: Any) -> None:
    monkeypatch.delenv("PAYLOAD_KEYS", raising=False)
    monkeypatch.delenv("PAYLOAD_KEYS_FILE", raising=False)
    api: Api = await api_factory()
    assert keys_of(api.stack.engine) is None

    refused = assert_problem(await api.http.post("/v1/sealed-values:reseal"), 409)
    assert refused["code"] == "no-payload-keys" and "PAYLOAD_KEYS" in refused["detail"]
    unknown = assert_problem(await api.http.get(f"/v1/reseal-batches/{uuid.uuid4().hex}"), 404)
    assert unknown["code"] == "reseal-batch-not-found"
    malformed = assert_problem(await api.http.get("/v1/reseal-batches/nope"), 422)
    assert "batch_id" in str(malformed)
    counts = (await api.http.get("/v1/sealed-values")).json()
    assert counts["current_key"] is None and counts["keys"] == {}
