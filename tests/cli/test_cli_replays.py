"""`outbox replays` against the real API on a loopback port."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from durable_outbox_temporal.contract.ids import item_workflow_id
from durable_outbox_temporal.contract.item import ItemStatus

from cli import ExitCode
from tests.cli.test_cli import run
from tests.cli.test_cli_conventions import exit_code


async def test_a_replay_is_started_followed_and_shown(
    served_api_factory: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    api = await served_api_factory(replay_confirm_over=1)
    outbox = f"cli-rp-{uuid.uuid4().hex[:6]}"
    for key in ("r-0", "r-1"):
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
        await api.stack.result(item_workflow_id(outbox, key))
    capsys.readouterr()
    start = ("replays", "start", outbox, "--target", api.webhook.name, "--status", "sent")

    # Two items, past the threshold of one: refused as a conflict until confirmed.
    assert await exit_code(api.url, *start) == ExitCode.CONFLICT
    assert "confirm_count=2" in capsys.readouterr().err
    await run(api.url, *start, "--confirm-count", "2", "--wait")
    replay = json.loads(capsys.readouterr().out)

    assert (replay["done"], replay["replayed"], replay["target"]) == (True, 2, api.webhook.name)
    sent = await api.stack.result(item_workflow_id(outbox, f"replay:{replay['id']}:r-0"))
    assert sent.status is ItemStatus.SENT
    await run(api.url, "replays", "show", outbox, replay["id"])
    assert json.loads(capsys.readouterr().out)["replayed"] == 2
