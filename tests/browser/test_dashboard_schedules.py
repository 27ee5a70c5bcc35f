"""The dashboard's schedules panel in a real browser, over the dev server (the time-skipping
server has no schedules): a schedule is listed, fired, unpaused and paused from its buttons."""

from __future__ import annotations

from typing import Any

import httpx
from playwright.async_api import Browser, expect

from tests.api.conftest import serve_stack
from tests.api.test_schedules import delete_schedules
from tests.conftest import unique_name, webhook_destination
from tests.workflows.test_lane import wait_for
from worker import default_operations_task_queue


async def test_a_schedule_is_fired_unpaused_and_paused_from_the_dashboard(
    dev_env: Any, stack_factory: Any, fake_provider: Any, browser: Browser
) -> None:
    webhook = webhook_destination(fake_provider)
    stack = await stack_factory(webhook, env=dev_env)
    schedule_id = unique_name("board")
    body = {
        "id": schedule_id,
        "outbox": "board",
        "items": [{"destination": webhook.name, "payload": {"day": "{{fire_date}}"}}],
        "cron": "0 6 1 1 *",
        "paused": True,
        "note": "until launch",
    }
    operations = default_operations_task_queue(stack.task_queue)
    async with serve_stack(stack, operations_task_queue=operations) as url:
        try:
            async with httpx.AsyncClient(base_url=url) as http:
                assert (await http.post("/v1/schedules", json=body)).status_code == 201
            page = await browser.new_page()
            await page.goto(url + "/")

            row = page.locator(f".schedule[data-schedule='{schedule_id}']")
            await expect(row.locator(".schedule-state")).to_have_text(
                "paused: until launch", timeout=15_000
            )
            await expect(row).to_contain_text("0 6 1 1 * → board, 1 item(s)")
            await row.locator("button.schedule-trigger").click()

            async def delivered() -> bool:
                return len(await fake_provider.admin.deliveries(webhook.name)) == 1

            await wait_for(delivered, limit_s=15)
            await row.locator("button.schedule-pause").click()  # unpause
            await expect(row.locator(".schedule-state")).to_have_text("active", timeout=15_000)
            await expect(row).to_contain_text("next", timeout=15_000)
            await row.locator("button.schedule-pause").click()  # pause again
            await expect(row.locator(".schedule-state")).to_have_text(
                "paused: from the dashboard", timeout=15_000
            )
            await expect(row).to_contain_text("last", timeout=15_000)
        finally:
            await delete_schedules(stack.client, schedule_id)
