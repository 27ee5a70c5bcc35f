"""The dashboard's dead-letters panel in a real browser: a failed item is listed with its error;
Discard takes one out, Redrive all brings the rest to `sent` through a redrive batch."""

from __future__ import annotations

import httpx
from durable_outbox_temporal.contract.ids import item_workflow_id, provider_idempotency_key
from durable_outbox_temporal.contract.item import ItemStatus
from playwright.async_api import Browser, expect

from tests.browser.conftest import accept_dialogs


async def test_dead_letters_are_discarded_and_redriven_from_the_dashboard(
    served_api_factory, browser: Browser
) -> None:
    api = await served_api_factory()
    async with httpx.AsyncClient(base_url=api.url) as http:
        for key in ("x-0", "x-1"):
            await api.stack.fake.admin.script(
                provider_idempotency_key(item_workflow_id("dead", key)),
                [{"status": 400, "body": "mailbox unknown"}],
            )
            response = await http.post(
                "/v1/outboxes/dead/items",
                json={"destination": api.webhook.name, "payload": {"key": key}},
                headers={"Idempotency-Key": key},
            )
            assert response.status_code == 202, response.text
            await api.stack.failure(item_workflow_id("dead", key))
    page = await browser.new_page()
    accept_dialogs(page)
    await page.goto(api.url + "/")
    await expect(page.locator("#live")).to_have_text("live: dead", timeout=10_000)

    discarded = page.locator("tr.dead-letter[data-key='x-0']")
    await expect(discarded).to_contain_text("mailbox unknown", timeout=15_000)
    await discarded.locator("button.dead-letter-discard").click()
    await expect(discarded).to_have_count(0, timeout=15_000)
    await page.locator("#redrive-all").click()

    await expect(page.locator("#redrive-batch")).to_contain_text("1 redriven", timeout=15_000)
    sent = await api.stack.result(item_workflow_id("dead", "x-1"))
    assert sent.status is ItemStatus.SENT
    await expect(page.locator("tr.item[data-key='x-1'] .status")).to_have_text(
        "sent", timeout=15_000
    )
    await expect(page.locator("tr.dead-letter")).to_have_count(0, timeout=15_000)
