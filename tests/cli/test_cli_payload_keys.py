"""`outbox payload-keys`: the values under each key, and `reseal` following its batch to the
end, after which the old key seals nothing."""

from __future__ import annotations

import json
from typing import Any

from durable_outbox_temporal.codec import EncryptionCodec, new_key_setting
from durable_outbox_temporal.contract.sealed_columns import seal_with

from tests.api.conftest import serve_stack
from tests.cli.test_cli import run
from tests.conftest import webhook_destination

K1_SETTING = new_key_setting("k1")


async def test_payload_keys_counts_and_reseal_follows_its_batch(
    stack_factory: Any, fake_provider: Any, capsys: Any, monkeypatch: Any
) -> None:
    webhook = webhook_destination(fake_provider)
    stack = await stack_factory(webhook)
    seal_with(stack.engine, EncryptionCodec.from_setting(K1_SETTING).value_keys())
    item = await stack.outbox.enqueue("cli-keys", webhook.name, {"k": "v"}, key="one")
    await stack.result(item.item_id)
    # The API (and, sharing its engine here, the worker) restarted with k2 in front.
    monkeypatch.setenv("PAYLOAD_KEYS", f"{new_key_setting('k2')},{K1_SETTING}")
    monkeypatch.delenv("PAYLOAD_KEYS_FILE", raising=False)
    async with serve_stack(stack) as url:
        await run(url, "payload-keys")
        before = json.loads(capsys.readouterr().out)
        await run(url, "payload-keys", "reseal")
        captured = capsys.readouterr()
        await run(url, "payload-keys")
        after = json.loads(capsys.readouterr().out)

    assert before["current_key"] == "k2" and before["keys"]["k1"] > 0
    resealed = json.loads(captured.out)
    assert (resealed["state"], resealed["resealed"]) == ("completed", before["keys"]["k1"])
    assert f"{resealed['resealed']} resealed under k2, 0 unreadable" in captured.err
    assert "(completed)" in captured.err
    assert after["keys"]["k1"] == 0 and after["keys"]["k2"] > 0
