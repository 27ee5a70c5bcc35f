"""The Temporal Web UI tells an item's story: its summary is on the workflow's page."""

from __future__ import annotations

from urllib.parse import quote

from playwright.async_api import Browser, expect

from tests.browser.conftest import ARTIFACTS
from tests.conftest import DEV_UI_PORT, webhook_destination


async def test_web_ui_shows_the_items_summary(
    dev_env, stack_factory, fake_provider, browser: Browser
) -> None:
    destination = webhook_destination(fake_provider)
    stack = await stack_factory(destination, env=dev_env)
    item = await stack.enqueue(destination, {"event": "invoice.paid"}, key="invoice-77")
    await stack.result(item.item_id)
    page = await browser.new_page()

    workflow_path = f"/namespaces/default/workflows/{quote(item.item_id, safe='')}"
    await page.goto(f"http://127.0.0.1:{DEV_UI_PORT}{workflow_path}")

    # This UI version shows the summary and current details under "User Metadata", each
    # rendered as markdown inside its own iframe.
    summary = f"Outbox tests: deliver via {destination.name} (key invoice-77)"
    try:
        await page.get_by_text("User Metadata").click(timeout=30_000)
        summary_frame = page.frame_locator("#user-metadata-summary")
        details_frame = page.frame_locator("#user-metadata-current-details")
        await expect(summary_frame.get_by_text(summary)).to_be_visible(timeout=15_000)
        await expect(details_frame.get_by_text("Sent: delivered.")).to_be_visible(timeout=15_000)
    finally:
        await page.screenshot(path=str(ARTIFACTS / "temporal-ui.png"), full_page=True)
