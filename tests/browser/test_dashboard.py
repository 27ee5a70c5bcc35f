"""The dashboard in a real browser: an item enqueued through the API appears and turns `sent`
without a reload, and its detail shows the event history."""

from __future__ import annotations

import httpx
from playwright.async_api import Browser, expect

from tests.browser.conftest import ARTIFACTS


async def test_row_appears_and_turns_sent_without_reload(
    served_api_factory, browser: Browser
) -> None:
    api = await served_api_factory()
    async with httpx.AsyncClient(base_url=api.url) as http:
        first = await http.post(
            "/v1/outboxes/demo/items",
            json={"destination": api.webhook.name, "payload": {"n": 0}},
            headers={"Idempotency-Key": "seed"},
        )
        await api.stack.result(first.json()["id"])
    page = await browser.new_page()
    await page.goto(api.url + "/")
    await expect(page.locator("#live")).to_have_text("live: demo", timeout=10_000)
    loads = []
    page.on("load", lambda _: loads.append(1))

    async with httpx.AsyncClient(base_url=api.url) as http:
        response = await http.post(
            "/v1/outboxes/demo/items",
            json={"destination": api.webhook.name, "payload": {"order": 42}},
            headers={"Idempotency-Key": "order-42"},
        )
    assert response.status_code == 202
    row = page.locator("tr.item[data-key='order-42']")
    await expect(row.locator(".status")).to_have_text("sent", timeout=15_000)
    await expect(page.locator("#counts")).to_have_text("sent: 2", timeout=5_000)
    await row.click()
    await expect(page.locator("#detail-status")).to_have_text("sent")
    await expect(page.locator("#detail")).to_contain_text("enqueued")
    await expect(page.locator("#detail")).to_contain_text('"order": 42')
    await page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)

    assert loads == []  # the row changed without the page reloading


async def test_enqueue_form_creates_an_item(served_api_factory, browser: Browser) -> None:
    api = await served_api_factory()
    page = await browser.new_page()
    await page.goto(api.url + "/")
    await expect(page.locator("#enqueue-destination option")).to_have_count(1, timeout=10_000)

    await page.fill("#enqueue-outbox", "forms")
    await page.fill("#enqueue-payload", '{"from": "browser"}')
    await page.click("#enqueue-button")

    await expect(page.locator("#enqueue-result")).to_contain_text("enqueued", timeout=10_000)
    await expect(page.locator("tr.item .status").first).to_have_text("sent", timeout=15_000)
