"""The dashboard's lanes panel in a real browser: a halted lane shows why, and its Skip button
resumes it."""

from __future__ import annotations

import httpx
from durable_outbox_temporal.contract.ids import item_workflow_id, provider_idempotency_key
from playwright.async_api import Browser, expect

from tests.workflows.test_lane import arrivals, item_result


async def test_a_halted_lane_shows_and_is_skipped_from_the_dashboard(
    served_api_factory, browser: Browser
) -> None:
    api = await served_api_factory()
    await api.stack.fake.admin.script(
        provider_idempotency_key(item_workflow_id("lanes", "b-0")),
        [{"status": 400, "body": "mailbox unknown"}],
    )
    async with httpx.AsyncClient(base_url=api.url) as http:
        for n in range(2):
            response = await http.post(
                "/v1/outboxes/lanes/items",
                json={"destination": api.webhook.name, "payload": {"n": n}, "ordering_key": "acct"},
                headers={"Idempotency-Key": f"b-{n}"},
            )
            assert response.status_code == 202, response.text
    page = await browser.new_page()
    await page.goto(api.url + "/")
    await expect(page.locator("#live")).to_have_text("live: lanes", timeout=10_000)

    lane = page.locator("tr.lane[data-lane='acct']")
    await expect(lane.locator(".status")).to_have_text("halted", timeout=15_000)
    await expect(lane).to_contain_text("mailbox unknown")
    await expect(lane).to_contain_text("b-0")
    await lane.locator("button.lane-skip").click()

    # Not skipping time: until the skip arrives, the halted lane waits on no timer at all.
    await item_result(api.stack, "b-1", outbox="lanes", skip_time=False)
    row = page.locator("tr.item[data-key='b-1']")
    await expect(row.locator(".status")).to_have_text("sent", timeout=15_000)
    await expect(lane.locator(".status")).not_to_have_text("halted", timeout=15_000)
    assert await arrivals(api.stack.fake, api.webhook) == [1]
