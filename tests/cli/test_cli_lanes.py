"""`outbox enqueue --ordering-key` and `outbox lanes` against the real API on a loopback port."""

from __future__ import annotations

import json

from durable_outbox_temporal.contract.ids import item_workflow_id, provider_idempotency_key

from tests.cli.test_cli import run
from tests.workflows.test_lane import arrivals, item_result, wait_for


async def test_a_halted_lane_is_listed_shown_and_skipped(served_api_factory, capsys) -> None:
    api = await served_api_factory()
    await api.stack.fake.admin.script(
        provider_idempotency_key(item_workflow_id("cli", "l-0")), [{"status": 400}]
    )
    for n in range(2):
        await run(
            api.url,
            "enqueue",
            "cli",
            "--destination",
            api.webhook.name,
            "--payload",
            json.dumps({"n": n}),
            "--key",
            f"l-{n}",
            "--ordering-key",
            "acct",
        )
    capsys.readouterr()

    async def halted() -> bool:
        await run(api.url, "lanes", "cli", "--status", "halted")
        listed = json.loads(capsys.readouterr().out)["lanes"]
        return [lane["ordering_key"] for lane in listed] == ["acct"]

    await wait_for(halted)
    await run(api.url, "lanes", "cli", "acct")
    shown = json.loads(capsys.readouterr().out)
    await run(api.url, "lanes", "cli", "acct", "--skip", "--reason", "bad data")
    skipped = json.loads(capsys.readouterr().out)
    await item_result(api.stack, "l-1", outbox="cli")

    assert shown["head_key"] == "l-0" and shown["waiting"] == ["l-1"]
    assert skipped == {"ordering_key": "acct", "head_key": "l-0", "action": "skip"}
    assert await arrivals(api.stack.fake, api.webhook) == [1]
