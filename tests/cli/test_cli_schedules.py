"""`outbox schedules ...` against the real API on a loopback port, over the dev server (the
time-skipping server has no schedules)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import serve_stack
from tests.api.test_schedules import delete_schedules
from tests.cli.test_cli import run
from tests.conftest import unique_name, webhook_destination
from tests.workflows.test_lane import wait_for
from worker import default_operations_task_queue


async def test_create_show_trigger_pause_unpause_delete(
    dev_env: Any, stack_factory: Any, fake_provider: Any, capsys: Any, tmp_path: Path
) -> None:
    webhook = webhook_destination(fake_provider)
    stack = await stack_factory(webhook, env=dev_env)
    schedule_id = unique_name("cli")
    # The file gives the outbox and one item; the flags add the rest.
    body = tmp_path / "schedule.json"
    body.write_text(
        json.dumps({"outbox": "cli", "items": [{"destination": webhook.name, "payload": {"n": 0}}]})
    )
    second = {"destination": webhook.name, "payload": {"day": "{{fire_date}}"}, "key_suffix": "d"}

    operations = default_operations_task_queue(stack.task_queue)
    async with serve_stack(stack, operations_task_queue=operations) as url:
        try:
            await run(
                url,
                "schedules",
                "create",
                schedule_id,
                "--file",
                str(body),
                "--cron",
                "30 7 * * *",
                "--timezone",
                "Europe/Paris",
                "--paused",
                "--item",
                json.dumps(second),
            )
            created = json.loads(capsys.readouterr().out)
            await run(url, "schedules", "trigger", schedule_id)
            triggered = json.loads(capsys.readouterr().out)

            async def fired() -> bool:
                await run(url, "schedules", "show", schedule_id)
                shown = json.loads(capsys.readouterr().out)
                return [fire["status"] for fire in shown["recent_fires"]] == ["completed"]

            await wait_for(fired, limit_s=15)
            await run(url, "schedules", "unpause", schedule_id, "--note", "go")
            unpaused = json.loads(capsys.readouterr().out)
            await run(url, "schedules", "pause", schedule_id)
            paused = json.loads(capsys.readouterr().out)

            async def listed() -> bool:  # Temporal's list trails a creation by a moment
                await run(url, "schedules", "list")
                entries = json.loads(capsys.readouterr().out)["schedules"]
                return schedule_id in [entry["id"] for entry in entries]

            await wait_for(listed, limit_s=10)
            await run(url, "schedules", "delete", schedule_id)
            deleted = json.loads(capsys.readouterr().out)
            with pytest.raises(SystemExit) as missing:
                await run(url, "schedules", "show", schedule_id)
            error = capsys.readouterr().err
        finally:
            await delete_schedules(stack.client, schedule_id)

    assert created["paused"] is True and created["cron"] == "30 7 * * *"
    assert created["timezone"] == "Europe/Paris" and created["outbox"] == "cli"
    assert [item["key_suffix"] for item in created["template"]] == [None, "d"]
    assert triggered == {"id": schedule_id, "triggered": True}
    assert unpaused["paused"] is False and unpaused["note"] == "go"
    assert unpaused["next_fire_times"] and paused["paused"] is True
    assert deleted == {"id": schedule_id, "deleted": True}
    assert missing.value.code == 3 and "HTTP 404" in error
    payloads = [entry["payload"] for entry in await fake_provider.admin.deliveries(webhook.name)]
    assert len(payloads) == 2 and {"n": 0} in payloads


async def test_a_bad_item_is_refused_with_its_field(served_api_factory: Any, capsys: Any) -> None:
    api = await served_api_factory()

    with pytest.raises(SystemExit):
        await run(api.url, "schedules", "create", "x", "--outbox", "cli", "--every", "60",
                  "--item", '{"destination": "nope", "payload": {}}')  # fmt: skip
    with pytest.raises(SystemExit):
        await run(api.url, "schedules", "create", "x", "--every", "60", "--item", "{not json")

    errors = capsys.readouterr().err.splitlines()
    assert (
        "HTTP 422" in errors[0] and "items.0.destination: unknown destination 'nope'" in errors[0]
    )
    assert errors[1].startswith("outbox: --item is not JSON")
