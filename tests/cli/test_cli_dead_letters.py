"""`outbox dead-letters` against the real API on a loopback port."""

from __future__ import annotations

import json
import uuid

from durable_outbox_temporal.contract.ids import item_workflow_id, provider_idempotency_key
from durable_outbox_temporal.contract.item import ItemStatus

from tests.cli.test_cli import run


async def test_dead_letters_are_listed_discarded_and_redriven(served_api_factory, capsys) -> None:
    api = await served_api_factory()
    outbox = f"cli-dl-{uuid.uuid4().hex[:6]}"
    for key in ("d-0", "d-1"):
        provider_key = provider_idempotency_key(item_workflow_id(outbox, key))
        await api.stack.fake.admin.script(provider_key, [{"status": 400}])
        await run(
            api.url,
            "enqueue",
            outbox,
            "--destination",
            api.webhook.name,
            "--payload",
            json.dumps({"key": key}),
            "--key",
            key,
        )
        await api.stack.failure(item_workflow_id(outbox, key))
    capsys.readouterr()

    await run(api.url, "dead-letters", outbox, "--destination", api.webhook.name)
    listed = json.loads(capsys.readouterr().out)["dead_letters"]
    assert [(letter["key"], letter["attempts"]) for letter in listed] == [("d-1", 1), ("d-0", 1)]

    await run(api.url, "dead-letters", outbox, "--discard", "d-0", "--reason", "test")
    assert json.loads(capsys.readouterr().out)["discard_reason"] == "test"
    await run(api.url, "dead-letters", outbox, "--redrive-all", "--wait")
    batch = json.loads(capsys.readouterr().out)

    assert (batch["done"], batch["redriven"]) == (True, 1)
    sent = await api.stack.result(item_workflow_id(outbox, "d-1"))
    assert sent.status is ItemStatus.SENT
    await run(api.url, "dead-letters", outbox, "--all")
    remaining = json.loads(capsys.readouterr().out)["dead_letters"]
    assert [(letter["key"], letter["discarded"]) for letter in remaining] == [("d-0", True)]
