"""The dashboard an operator glances at (issue 32), in a real browser: a health tile per
destination with its sent/failed chart, failures above the items, the item table paged and
filtered, deep links to an item, and only the buttons an item's status accepts."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from durable_outbox_temporal.contract.ids import item_workflow_id, provider_idempotency_key
from playwright.async_api import Browser, Page, Route, expect

from tests.api.conftest import ServedApi
from tests.browser.conftest import ARTIFACTS, reload_until

ApiFactory = Callable[..., Awaitable[ServedApi]]

# The docs' screenshots are taken again with DOCS_SCREENSHOTS=1; otherwise they go with the
# other browser artifacts, so a test run leaves the docs as they are.
IMAGES = (
    Path(__file__).resolve().parents[2] / "docs" / "images"
    if os.environ.get("DOCS_SCREENSHOTS") == "1"
    else ARTIFACTS
)


async def seed(api: ServedApi, outbox: str, sent: int = 3) -> None:
    """`sent` items delivered and one (`bad-0`) failed for good, all to the webhook; without
    skipping time, so they end within the activity chart's last hour."""
    await api.stack.fake.admin.script(
        provider_idempotency_key(item_workflow_id(outbox, "bad-0")),
        [{"status": 400, "body": "mailbox unknown"}],
    )
    async with httpx.AsyncClient(base_url=api.url) as http:
        for n in range(sent):
            response = await http.post(
                f"/v1/outboxes/{outbox}/items",
                json={"destination": api.webhook.name, "payload": {"n": n}},
                headers={"Idempotency-Key": f"ok-{n}"},
            )
            assert response.status_code == 202, response.text
            await api.stack.result(item_workflow_id(outbox, f"ok-{n}"), skip_time=False)
        response = await http.post(
            f"/v1/outboxes/{outbox}/items",
            json={"destination": api.webhook.name, "payload": {"bad": True}},
            headers={"Idempotency-Key": "bad-0"},
        )
        assert response.status_code == 202, response.text
        await api.stack.failure(item_workflow_id(outbox, "bad-0"), skip_time=False)


async def open_dashboard(browser: Browser, url: str, outbox: str) -> Page:
    page = await browser.new_page(viewport={"width": 1500, "height": 1000})
    await page.goto(url)
    await expect(page.locator("#live")).to_have_text(f"live: {outbox}", timeout=10_000)
    return page


async def test_activity_route_counts_sent_and_failed_per_minute(
    served_api_factory: ApiFactory, dev_env: Any
) -> None:
    # The dev server's clock: the shared time-skipping server's may be years ahead by now.
    api = await served_api_factory(env=dev_env)
    outbox = "glance-activity"
    await seed(api, outbox, sent=2)
    async with httpx.AsyncClient(base_url=api.url) as http:
        name = api.webhook.name
        for _ in range(50):  # the read model follows the workflows shortly after
            body = (await http.get(f"/v1/destinations/{name}/activity?minutes=5")).json()
            if sum(m["failed"] for m in body["minutes"]) == 1:
                break
        assert len(body["minutes"]) == 5
        assert sum(m["sent"] for m in body["minutes"]) == 2
        assert sum(m["failed"] for m in body["minutes"]) == 1
        assert body["queued"] == 0 and body["oldest_queued_age_s"] is None
        unknown = await http.get("/v1/destinations/nowhere/activity")
        assert unknown.status_code == 404
        assert unknown.headers["content-type"].startswith("application/problem+json")
        too_many = await http.get(f"/v1/destinations/{name}/activity?minutes=0")
        assert too_many.status_code == 422


async def test_health_strip_and_failures_first(
    served_api_factory: ApiFactory, browser: Browser, dev_env: Any
) -> None:
    # The dev server: the tile shows the destination's state and rate in force, as in use.
    api = await served_api_factory(env=dev_env)
    outbox = "glance-strip"
    await seed(api, outbox)
    page = await open_dashboard(browser, api.url + f"/#/outboxes/{outbox}", outbox)

    tile = page.locator(f"#health .tile[data-destination='{api.webhook.name}']")
    await expect(tile.locator("svg.spark polyline.spark-sent")).to_have_count(1, timeout=15_000)
    await expect(tile.locator("svg.spark polyline.spark-failed")).to_have_count(1)
    await expect(tile.locator(".state")).to_be_visible()
    # The strip refreshes every 30 s; a reload reads the settled read model now.
    await reload_until(page, tile.locator(".legend"), "3 sent, 1 failed")
    await expect(tile.locator(".sent-count")).to_have_text("3 sent")
    await expect(tile.locator(".failed-count")).to_have_text("1 failed")
    await expect(tile.locator(".queue")).to_contain_text("queued 0")

    dead = page.locator("tr.dead-letter[data-key='bad-0']")
    await expect(dead).to_contain_text("mailbox unknown", timeout=15_000)
    await expect(page.locator("tr.item[data-key='ok-0']")).to_be_visible(timeout=15_000)
    dead_box = await page.locator("#dead-letters").bounding_box()
    items_box = await page.locator("#items").bounding_box()
    strip_box = await page.locator("#health").bounding_box()
    assert dead_box and items_box and strip_box
    assert strip_box["y"] < dead_box["y"] < items_box["y"]

    await page.locator("tr.item[data-key='bad-0']").click()
    await expect(page.locator("#detail-status")).to_have_text("failed")
    await expect(page.locator("#redrive-button")).to_be_visible()
    await expect(page.locator("#cancel-button")).to_have_count(0)
    await expect(page.locator("#detail")).not_to_contain_text("pending")
    IMAGES.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(IMAGES / "dashboard.png"), full_page=True)


async def test_deep_link_opens_a_sent_item_without_cancel(
    served_api_factory: ApiFactory, browser: Browser
) -> None:
    api = await served_api_factory()
    outbox = "glance-link"
    await seed(api, outbox, sent=1)
    page = await open_dashboard(browser, api.url + f"/#/outboxes/{outbox}/items/ok-0", outbox)
    await expect(page.locator("#detail h2").first).to_have_text("Item ok-0", timeout=15_000)
    await expect(page.locator("#detail-status")).to_have_text("sent")
    await expect(page.locator("#cancel-button")).to_have_count(0)
    await expect(page.locator("#redrive-button")).to_have_count(0)
    # The times carry their date, not only the hour.
    year = str(await page.evaluate("new Date().getFullYear()"))
    await expect(page.locator("#detail table").first).to_contain_text(year)


async def test_an_item_on_a_paused_destination_says_so_and_can_be_cancelled(
    served_api_factory: ApiFactory, browser: Browser, dev_env: Any
) -> None:
    # The dev server: the time-skipping one cannot pause a destination's queue.
    api = await served_api_factory(env=dev_env)
    outbox = "glance-paused"
    async with httpx.AsyncClient(base_url=api.url) as http:
        url = f"/v1/destinations/{api.webhook.name}"
        paused = await http.patch(url, json={"paused": True, "reason": "provider maintenance"})
        assert paused.status_code == 200, paused.text
        try:
            response = await http.post(
                f"/v1/outboxes/{outbox}/items",
                json={"destination": api.webhook.name, "payload": {"n": 1}},
                headers={"Idempotency-Key": "held-0"},
            )
            assert response.status_code == 202, response.text
            page = await open_dashboard(
                browser, api.url + f"/#/outboxes/{outbox}/items/held-0", outbox
            )
            await expect(page.locator("#detail-status")).to_have_text("queued", timeout=15_000)
            await expect(page.locator("#detail-waiting")).to_contain_text(
                "provider maintenance", timeout=15_000
            )
            await expect(page.locator("#cancel-button")).to_be_visible()
            await expect(page.locator("#redrive-button")).to_have_count(0)
            tile = page.locator(f"#health .tile[data-destination='{api.webhook.name}'] .state")
            await expect(tile).to_contain_text("paused", timeout=15_000)
        finally:
            await http.patch(url, json={"paused": False})


async def test_items_are_paged_and_filtered(
    served_api_factory: ApiFactory, browser: Browser
) -> None:
    api = await served_api_factory()
    outbox = "glance-pages"
    await seed(api, outbox, sent=3)
    page = await open_dashboard(browser, api.url + f"/?page_size=2#/outboxes/{outbox}", outbox)
    rows = page.locator("#items tr.item")
    await expect(page.locator("#page-info")).to_have_text("page 1", timeout=15_000)
    await expect(rows).to_have_count(2)
    first_keys = set(await rows.evaluate_all("rs => rs.map(r => r.dataset.key)"))
    await page.locator("#next-page").click()
    await expect(page.locator("#page-info")).to_have_text("page 2 (last)", timeout=10_000)
    await expect(rows).to_have_count(2)
    second_keys = set(await rows.evaluate_all("rs => rs.map(r => r.dataset.key)"))
    assert not first_keys & second_keys
    assert first_keys | second_keys == {"ok-0", "ok-1", "ok-2", "bad-0"}
    await page.locator("#first-page").click()
    await expect(page.locator("#page-info")).to_have_text("page 1", timeout=10_000)

    await page.locator("#status-filter").select_option("failed")
    await expect(rows).to_have_count(1, timeout=10_000)
    await expect(rows.first).to_have_attribute("data-key", "bad-0")
    await page.locator("#status-filter").select_option("")
    # Until the filtered first page is in, there is no next page: the unfiltered list's cursor,
    # followed with the filter, would open a page of the other list (CI once clicked in that
    # moment and saw two rows on the filtered list's last page). The filtered load is held to
    # look at that moment.
    filtered_load_out, released = asyncio.Event(), asyncio.Event()

    async def hold(route: Route) -> None:
        filtered_load_out.set()
        await released.wait()
        await route.continue_()

    await page.route("**/items?*key_prefix=ok-*", hold)
    # Typed, then the field left: the browser's own change event, as a user's.
    await page.locator("#key-filter").fill("ok-")
    await page.locator("#key-filter").blur()
    await asyncio.wait_for(filtered_load_out.wait(), 10)
    await expect(page.locator("#next-page")).to_be_disabled()
    released.set()
    await expect(page.locator("#page-info")).to_have_text("page 1", timeout=10_000)
    await page.locator("#next-page").click()
    await expect(rows).to_have_count(1, timeout=10_000)
    await expect(page.locator("#page-info")).to_have_text("page 2 (last)")


async def test_a_slower_earlier_load_never_replaces_the_filtered_list(
    served_api_factory: ApiFactory, browser: Browser
) -> None:
    """Two loads out at once (a filter changed twice, or during the periodic refresh): the
    answer of the earlier one, arriving last, is not shown over the newer one's."""
    api = await served_api_factory()
    outbox = "glance-race"
    await seed(api, outbox, sent=2)
    page = await open_dashboard(browser, api.url + f"#/outboxes/{outbox}", outbox)
    rows = page.locator("#items tr.item")
    await expect(rows).to_have_count(3, timeout=15_000)

    async def slow_unless_failed(route: Route) -> None:
        if "status=failed" not in route.request.url:
            await asyncio.sleep(1.5)
        await route.continue_()

    await page.route("**/items?*", slow_unless_failed)
    await page.locator("#status-filter").select_option("sent")
    await page.locator("#status-filter").select_option("failed")
    await expect(rows).to_have_count(1, timeout=10_000)
    await page.wait_for_timeout(2_500)  # the slow "sent" answer has come by now

    await expect(rows).to_have_count(1)
    await expect(rows.first).to_have_attribute("data-key", "bad-0")


async def test_aggregates_page_prefills_commands_and_shows_events_as_rows(
    served_api_factory: ApiFactory, browser: Browser
) -> None:
    api = await served_api_factory()
    page = await browser.new_page(viewport={"width": 1500, "height": 1000})
    await page.goto(api.url + "/aggregates")
    await expect(page.locator("#types li.active")).to_have_text("flight", timeout=10_000)
    await page.fill("#open-id", "GL001")
    await page.click("#open-form button")

    await page.select_option("#command-name", "assign_seat")
    prefilled = json.loads(await page.locator("#command-payload").input_value())
    assert {"seat", "passenger_id"} <= set(prefilled)  # from the command's JSON schema
    await page.select_option("#command-name", "open")
    assert "seats" in json.loads(await page.locator("#command-payload").input_value())
    await page.fill("#command-payload", '{"seats": ["1A", "1B"]}')
    await page.click("#command-button")
    await expect(page.locator("#command-result")).to_have_text("version 1: FlightOpened")
    await page.select_option("#command-name", "assign_seat")
    await page.fill("#command-payload", '{"seat": "1A", "passenger_id": "p1"}')
    await page.click("#command-button")

    event = page.locator("#events tr.event[data-seq='2']")
    await expect(event.locator(".event-type")).to_have_text("SeatAssigned", timeout=10_000)
    await expect(event.locator("dl.fields dt").first).to_be_visible()
    await expect(event.locator("dl.fields")).to_contain_text("passenger id")
    await expect(event).not_to_contain_text("{")  # fields, not raw JSON
    IMAGES.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(IMAGES / "aggregates.png"), full_page=True)
