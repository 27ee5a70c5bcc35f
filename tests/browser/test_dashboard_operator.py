"""The dashboard as an operator tries it against the dev server: the item panel fits a laptop's
screen with the attempt's response status in sight, empty failure sections say "none", a
destination's view shows its rates, pause and flow rules in force (those changed at run time
marked), reached by a deep link, and the page loads without a console error."""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, ConsoleMessage, Page, expect

from tests.api.conftest import ServedApi
from tests.browser.conftest import ARTIFACTS, reload_until
from tests.browser.test_dashboard_glance import seed

ApiFactory = Callable[..., Awaitable[ServedApi]]

# As in test_dashboard_glance: the docs' screenshot is taken again with DOCS_SCREENSHOTS=1 only.
IMAGES = (
    Path(__file__).resolve().parents[2] / "docs" / "images"
    if os.environ.get("DOCS_SCREENSHOTS") == "1"
    else ARTIFACTS
)


async def open_page(browser: Browser, url: str, outbox: str, width: int, height: int) -> Page:
    page = await browser.new_page(viewport={"width": width, "height": height})
    await page.goto(url)
    await expect(page.locator("#live")).to_have_text(f"live: {outbox}", timeout=10_000)
    return page


async def overflow(page: Page) -> int:
    """How many pixels the page is wider than the viewport (0: it fits)."""
    found: int = await page.evaluate(
        "Math.max(0, document.documentElement.scrollWidth - window.innerWidth)"
    )
    return found


@pytest.mark.parametrize(("width", "height"), [(1280, 800), (1400, 1000)])
async def test_the_item_panel_fits_with_the_attempts_status_in_sight(
    served_api_factory: ApiFactory, browser: Browser, dev_env: Any, width: int, height: int
) -> None:
    api = await served_api_factory(env=dev_env)
    outbox = f"operator-fit-{width}"
    await seed(api, outbox, sent=1)
    page = await open_page(
        browser, api.url + f"/#/outboxes/{outbox}/items/bad-0", outbox, width, height
    )
    await expect(page.locator("#detail h2").first).to_have_text("Item bad-0", timeout=15_000)
    status = page.locator("#attempts td.attempt-status").first
    await expect(status).to_have_text("400", timeout=15_000)
    await expect(page.locator("tr.dead-letter[data-key='bad-0']")).to_be_visible(timeout=15_000)
    await expect(page.locator("#dead-letters-none")).to_be_hidden()

    assert await overflow(page) == 0
    cell = await status.bounding_box()
    panel = await page.locator("#detail").bounding_box()
    assert cell and panel
    # Within the panel (not scrolled out of its table) and within the window.
    assert panel["x"] <= cell["x"] and cell["x"] + cell["width"] <= panel["x"] + panel["width"]
    assert cell["x"] + cell["width"] <= width
    # The events' times are short, with the full date and time on hover.
    year = str(await page.evaluate("new Date().getFullYear()"))
    event_time = page.locator("#detail table").first.locator("td.time").first
    await expect(event_time).to_contain_text(year)
    await expect(event_time).to_have_attribute("title", re.compile(year))
    await page.screenshot(path=str(ARTIFACTS / f"operator-item-{width}.png"), full_page=True)


async def test_empty_failure_sections_say_none(
    served_api_factory: ApiFactory, browser: Browser, dev_env: Any
) -> None:
    api = await served_api_factory(env=dev_env)
    outbox = "operator-calm"
    async with httpx.AsyncClient(base_url=api.url) as http:
        response = await http.post(
            f"/v1/outboxes/{outbox}/items",
            json={"destination": api.webhook.name, "payload": {"n": 1}},
            headers={"Idempotency-Key": "ok-0"},
        )
        assert response.status_code == 202, response.text
    page = await open_page(browser, api.url + f"/#/outboxes/{outbox}", outbox, 1400, 1000)
    await expect(page.locator("tr.item[data-key='ok-0']")).to_be_visible(timeout=15_000)
    for section in ("lanes", "dead-letters"):
        await expect(page.locator(f"#{section}-none")).to_have_text("none")
        await expect(page.locator(f"#{section}")).to_be_hidden()
    # Failures still come first.
    failures = await page.locator("#failures").bounding_box()
    items = await page.locator("#items").bounding_box()
    assert failures and items and failures["y"] < items["y"]


async def test_the_destination_view_shows_the_flow_rules_in_force_and_their_source(
    served_api_factory: ApiFactory, browser: Browser, dev_env: Any
) -> None:
    api = await served_api_factory(env=dev_env)
    outbox = "operator-flow"
    await seed(api, outbox, sent=1)
    name = api.webhook.name
    url = f"/v1/destinations/{name}"
    async with httpx.AsyncClient(base_url=api.url) as http:
        changed = await http.patch(url, json={"submit_rate": 7, "flow": {"max_in_flight": 3}})
        assert changed.status_code == 200, changed.text
        assert changed.json()["flow_policy"]["max_in_flight"]["source"] == "api"
        page = await open_page(browser, api.url + f"/#/outboxes/{outbox}", outbox, 1280, 800)

        # Opened from the destinations list.
        await page.locator(f"#destinations [data-destination='{name}'] a.name").click()
        await expect(page.locator("#detail h2").first).to_have_text(f"Destination {name}")
        assert page.url.endswith(f"#/destinations/{name}")
        cap = page.locator("#flow-policy tr[data-field='max_in_flight']")
        await expect(cap.locator(".value")).to_have_text("3")
        await expect(cap).to_have_class("changed")
        await expect(cap.locator(".source")).to_contain_text("changed at run time")
        breaker = page.locator("#flow-policy tr[data-field='breaker']")
        await expect(breaker.locator(".source")).to_have_text("destinations file")
        await expect(breaker).not_to_have_class("changed")
        submit = page.locator("#destination-rates tr[data-queue='submit']")
        await expect(submit.locator(".rate")).to_have_text("7/s")
        await expect(submit.locator(".source")).to_have_text("set at run time")
        await expect(page.locator("#destination-rates tr[data-queue='poll'] .source")).to_have_text(
            "configured"
        )
        await expect(page.locator("#destination-circuit")).to_have_text("closed")
        await expect(page.locator("#destination-paused")).to_have_text("no")
        # Its cap's fill, fleet-wide: nothing out now.
        await expect(page.locator("#destination-in-flight")).to_have_text("0 of 3 out now")
        assert await overflow(page) == 0
        # The policy's table fits its panel: no column scrolled out of sight.
        scroll = page.locator("#flow-policy").locator("xpath=..")
        assert await scroll.evaluate("box => box.scrollWidth <= box.clientWidth")
        IMAGES.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(IMAGES / "dashboard-destination.png"), full_page=True)

        # Paused from the API: the view, opened from its health tile, says why.
        await page.locator("tr.item[data-key='ok-0']").click()
        await expect(page.locator("#detail h2").first).to_have_text("Item ok-0")
        paused = await http.patch(url, json={"paused": True, "reason": "provider maintenance"})
        assert paused.status_code == 200, paused.text
        try:
            tile = page.locator(f"#health .tile[data-destination='{name}']")
            await reload_until(page, tile.locator(".state"), "paused")
            await expect(page.locator("#detail h2").first).to_have_text("Item ok-0")
            await tile.click()
            await expect(page.locator("#detail h2").first).to_have_text(f"Destination {name}")
            await expect(page.locator("#destination-paused")).to_contain_text(
                "provider maintenance"
            )
            await expect(
                page.locator("#destination-rates tr[data-queue='submit'] .rate")
            ).to_contain_text("resumes at 7/s")
        finally:
            await http.patch(url, json={"paused": False})


async def test_a_deep_link_opens_the_destination_view(
    served_api_factory: ApiFactory, browser: Browser, dev_env: Any
) -> None:
    api = await served_api_factory(env=dev_env)
    outbox = "operator-link"
    await seed(api, outbox, sent=1)
    name = api.webhook.name
    page = await open_page(browser, api.url + f"/#/destinations/{name}", outbox, 1280, 800)
    await expect(page.locator("#detail h2").first).to_have_text(f"Destination {name}")
    await expect(page.locator("#flow-policy tr[data-field='quotas'] .source")).to_have_text(
        "destinations file"
    )
    # The outbox shown is the first one, as without a link; an item opened replaces the view.
    await page.locator("tr.item[data-key='ok-0']").click()
    await expect(page.locator("#detail h2").first).to_have_text("Item ok-0")
    assert page.url.endswith(f"#/outboxes/{outbox}/items/ok-0")
    # The link followed in the open page (a hash change) opens the view again.
    await page.evaluate("link => { location.hash = link; }", f"#/destinations/{name}")
    await expect(page.locator("#detail h2").first).to_have_text(f"Destination {name}")


async def test_the_page_loads_without_console_errors(
    served_api_factory: ApiFactory, browser: Browser, dev_env: Any
) -> None:
    api = await served_api_factory(env=dev_env)
    outbox = "operator-quiet"
    await seed(api, outbox, sent=1)
    page = await browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error" or "[DOM]" in message.text:
            errors.append(f"{message.type}: {message.text}")

    page.on("console", on_console)
    page.on("pageerror", lambda error: errors.append(f"pageerror: {error}"))
    await page.goto(api.url + f"/#/outboxes/{outbox}/items/bad-0")
    await expect(page.locator("#live")).to_have_text(f"live: {outbox}", timeout=10_000)
    await expect(page.locator("#attempts td.attempt-status").first).to_have_text(
        "400", timeout=15_000
    )
    await expect(
        page.locator(f"#health .tile[data-destination='{api.webhook.name}']")
    ).to_be_visible(timeout=15_000)
    await expect(
        page.locator(f"#destinations [data-destination='{api.webhook.name}']")
    ).to_be_visible()
    assert errors == []
