"""The aggregates page shows a labour readably — contractions, updates, subscribers — and its
effect ledger, updating live, with a Retry button on a failed effect."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from playwright.async_api import Browser, expect

from tests.browser.conftest import ARTIFACTS


async def test_labour_view_and_effects_update_live(served_api_factory, browser: Browser) -> None:
    # This stack has no `fake-email` destination: the announcement's notification fails, and
    # an operator can retry it from the page (it fails again, with the same reason).
    api = await served_api_factory()
    url = f"{api.url}/v1/aggregates/labour/lab-ui"
    email = {"email": "bo@example.com"}
    async with httpx.AsyncClient() as http:

        async def run(command: str, **payload: Any) -> None:
            response = await http.post(f"{url}/commands/{command}", json=payload)
            assert response.status_code == 200, response.text

        await run("plan_labour", actor="m1", mother_name="Ada", contact={"email": "a@x.io"})
        token = None
        while not token:  # set by the token policy's effect a moment later
            await asyncio.sleep(0.05)
            # Secret: the mother reads it (no tokens here, so `?actor=` says who reads).
            state = (await http.get(url, params={"actor": "m1"})).json()["state"]
            token = state["subscription_token"]
        await run("request_access", actor="s1", token=token, name="Bo", contact=email)
        await run("approve_subscriber", actor="m1", subscriber="s1", role="birth_partner")
        await run("start_contraction", actor="s1")
        await run("end_contraction", actor="s1")
        await run("post_update", actor="s1", message="4 cm", kind="status")
        await run("post_update", actor="m1", message="It's a girl!", kind="announcement")

        page = await browser.new_page()
        await page.goto(api.url + "/aggregates")
        await page.locator("#types li", has_text="labour").click()
        await page.fill("#open-id", "lab-ui")
        await page.click("#open-form button")

        await expect(page.locator("#labour-title")).to_have_text("Ada · planned", timeout=10_000)
        await expect(page.locator("#contractions tr")).to_have_count(1)
        await expect(page.locator("#updates tr")).to_have_count(2)
        await expect(page.locator("#updates tr.announcement")).to_contain_text("It's a girl!")
        await expect(page.locator("#subscribers tr")).to_contain_text("birth_partner")
        token_effect = page.locator("#effects tr", has_text="subscription-token")
        await expect(token_effect).to_contain_text("done")
        failed = page.locator("#effects tr", has_text="notify.s1.email")
        await expect(failed).to_contain_text("UnknownDestination", timeout=10_000)

        # Live: a new update shows without a reload.
        await run("post_update", actor="s1", message="5 cm", kind="status")
        await expect(page.locator("#updates tr")).to_have_count(3, timeout=10_000)
        await expect(page.locator("#updates tr").first).to_contain_text("5 cm")

        await failed.get_by_role("button", name="Retry").click()
        await expect(failed.locator("td").nth(3)).to_have_text("2", timeout=10_000)
        await expect(failed).to_contain_text("failed")
        await page.screenshot(path=str(ARTIFACTS / "labour.png"), full_page=True)
