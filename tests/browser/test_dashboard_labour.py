"""The aggregates page shows a labour readably — contractions, updates, subscribers — and its
effect ledger, updating live, with a Retry button on a failed effect."""

from __future__ import annotations

import asyncio
import urllib.parse
from typing import Any

import httpx
from playwright.async_api import Browser, Page, Route, expect

from examples.labour.domainmodel import EMAIL_DESTINATION, NOTIFICATIONS_OUTBOX
from tests.browser.conftest import ARTIFACTS
from tests.conftest import email_destination


class Labour:
    """Commands to one labour through the API, as the page's user would send them."""

    def __init__(self, http: httpx.AsyncClient, api_url: str, labour_id: str) -> None:
        self.http = http
        self.url = f"{api_url}/v1/aggregates/labour/{labour_id}"

    async def run(self, command: str, **payload: Any) -> None:
        response = await self.http.post(f"{self.url}/commands/{command}", json=payload)
        assert response.status_code == 200, response.text

    async def with_subscriber(self, role: str) -> None:
        """Planned by `m1`, with `s1` subscribed (by the token its policy sets) and approved."""
        await self.run("plan_labour", actor="m1", mother_name="Ada", contact={"email": "a@x.io"})
        token = None
        while not token:  # set by the token policy's effect a moment later
            await asyncio.sleep(0.05)
            # Secret: the mother reads it (no tokens here, so `?actor=` says who reads).
            state = (await self.http.get(self.url, params={"actor": "m1"})).json()["state"]
            token = state["subscription_token"]
        contact = {"email": "bo@example.com"}
        await self.run("request_access", actor="s1", token=token, name="Bo", contact=contact)
        await self.run("approve_subscriber", actor="m1", subscriber="s1", role=role)


async def open_labour(browser: Browser, api_url: str, labour_id: str) -> Page:
    page = await browser.new_page()
    await page.goto(api_url + "/aggregates")
    await page.locator("#types li", has_text="labour").click()
    await page.fill("#open-id", labour_id)
    await page.click("#open-form button")
    return page


async def test_labour_view_and_effects_update_live(served_api_factory, browser: Browser) -> None:
    # This stack has no `fake-email` destination: the announcement's notification fails, and
    # an operator can retry it from the page (it fails again, with the same reason).
    api = await served_api_factory()
    async with httpx.AsyncClient() as http:
        labour = Labour(http, api.url, "lab-ui")
        run = labour.run
        await labour.with_subscriber("birth_partner")
        await run("start_contraction", actor="s1")
        await run("end_contraction", actor="s1")
        await run("post_update", actor="s1", message="4 cm", kind="status")
        await run("post_update", actor="m1", message="It's a girl!", kind="announcement")

        page = await open_labour(browser, api.url, "lab-ui")

        await expect(page.locator("#labour-title")).to_have_text("Ada · planned")
        await expect(page.locator("#contractions tr")).to_have_count(1)
        await expect(page.locator("#updates tr")).to_have_count(2)
        await expect(page.locator("#updates tr.announcement")).to_contain_text("It's a girl!")
        await expect(page.locator("#subscribers tr")).to_contain_text("birth_partner")
        token_effect = page.locator("#effects tr", has_text="subscription-token")
        await expect(token_effect).to_contain_text("done")
        failed = page.locator("#effects tr", has_text="notify.s1.email")
        await expect(failed).to_contain_text("UnknownDestination")

        # Live: a new update shows without a reload.
        await run("post_update", actor="s1", message="5 cm", kind="status")
        await expect(page.locator("#updates tr")).to_have_count(3)
        await expect(page.locator("#updates tr").first).to_contain_text("5 cm")

        await failed.get_by_role("button", name="Retry").click()
        await expect(failed.locator("td").nth(3)).to_have_text("2")
        await expect(failed).to_contain_text("failed")
        await page.screenshot(path=str(ARTIFACTS / "labour.png"), full_page=True)


async def test_an_event_that_leaves_the_effects_as_they_were_leaves_their_rows_in_place(
    served_api_factory, browser: Browser
) -> None:
    """Each live event asks for the ledger again: rows built again for an unchanged ledger
    replaced a link or a Retry button under the pointer, and the click landing on it was lost
    (the test below clicked an effect's link while the page's first events arrived)."""
    api = await served_api_factory()
    async with httpx.AsyncClient() as http:
        labour = Labour(http, api.url, "lab-still")
        await labour.with_subscriber("birth_partner")
        page = await open_labour(browser, api.url, "lab-still")
        await expect(page.locator("#effects-summary")).to_have_text("0 pending · 1 done · 0 failed")
        await expect(page.locator("#subscribers tr")).to_contain_text("birth_partner")
        await page.evaluate(
            """() => {
                window.effectsMutations = 0;
                const count = (seen) => { window.effectsMutations += seen.length; };
                new MutationObserver(count).observe(
                    document.getElementById("effects"), { childList: true, subtree: true });
            }"""
        )

        # An event with no effect: the page asks for the ledger again and gets the same one.
        async with page.expect_response(lambda response: response.url.endswith("/effects")):
            await labour.run("start_contraction", actor="s1")
        await expect(page.locator("#contractions tr")).to_have_count(1)
        await page.wait_for_timeout(500)

        assert await page.evaluate("window.effectsMutations") == 0
        await expect(page.locator("#effects tr", has_text="subscription-token")).to_contain_text(
            "done"
        )


async def test_an_aggregate_opened_with_many_events_has_its_state_read_a_few_times(
    served_api_factory, browser: Browser
) -> None:
    """Opening an aggregate streams every event it has, and each event is a change of state: a
    state read for each sent the API two requests an event (the state and the effects), from
    one tab, as many for a hot aggregate's hundreds of commands a second."""
    updates = 40
    api = await served_api_factory()
    async with httpx.AsyncClient() as http:
        labour = Labour(http, api.url, "lab-many")
        await labour.run("plan_labour", actor="m1", mother_name="Ada", contact={"email": "a@x.io"})
        for n in range(updates):
            await labour.run("post_update", actor="m1", message=f"{n} cm", kind="status")
        state_url = f"{api.url}/v1/aggregates/labour/lab-many"
        version = (await http.get(state_url, params={"actor": "m1"})).json()["version"]

    page = await browser.new_page()
    reads: list[str] = []
    page.on("request", lambda request: reads.append(request.url.split("?")[0]))
    await page.goto(api.url + "/aggregates")
    await page.locator("#types li", has_text="labour").click()
    await page.fill("#open-id", "lab-many")
    await page.click("#open-form button")

    await expect(page.locator("#events tr")).to_have_count(version)
    # The page ends on the state after the last event.
    await expect(page.locator("#version")).to_have_text(f"version {version}")
    await expect(page.locator("#updates tr")).to_have_count(updates)
    await page.wait_for_timeout(500)
    state_reads = reads.count(state_url)
    assert 1 <= state_reads <= 10, state_reads


async def test_a_slow_read_of_the_aggregate_opened_before_shows_nothing_of_it(
    served_api_factory, browser: Browser
) -> None:
    """A state read of the aggregate opened first that comes back after another was opened (a
    slow answer, or a read a live event started) would show the first one's state under the
    second's title."""
    api = await served_api_factory()
    async with httpx.AsyncClient() as http:
        for labour_id, mother in (("lab-first", "Ada"), ("lab-second", "Bea")):
            await Labour(http, api.url, labour_id).run(
                "plan_labour", actor="m1", mother_name=mother, contact={"email": "a@x.io"}
            )
    page = await browser.new_page()

    async def slowly(route: Route) -> None:
        await asyncio.sleep(1.5)
        await route.continue_()

    await page.route(f"{api.url}/v1/aggregates/labour/lab-first", slowly)
    await page.goto(api.url + "/aggregates")
    await page.locator("#types li", has_text="labour").click()
    await page.fill("#open-id", "lab-first")
    await page.click("#open-form button")
    await page.fill("#open-id", "lab-second")
    await page.click("#open-form button")

    await expect(page.locator("#labour-title")).to_have_text("Bea · planned")
    await page.wait_for_timeout(2_500)  # the first one's answer has come back by now
    await expect(page.locator("#labour-title")).to_have_text("Bea · planned")
    await expect(page.locator("#title")).to_have_text("labour lab-second")


async def test_an_effect_that_enqueued_an_item_links_to_it(
    served_api_factory, browser: Browser, fake_provider, own_time_skipping_env
) -> None:
    # The labour's notifications go to `fake-email`, a fixed name: on a server of its own, so
    # no other test's worker serves that destination's queues.
    email = email_destination(fake_provider, name=EMAIL_DESTINATION)
    api = await served_api_factory(env=own_time_skipping_env, destinations=[email])
    async with httpx.AsyncClient() as http:
        labour = Labour(http, api.url, "lab-link")
        await labour.with_subscriber("observer")
        await labour.run("post_update", actor="m1", message="It's a boy!", kind="announcement")

        page = await open_labour(browser, api.url, "lab-link")

        notify = page.locator("#effects tr", has_text="notify.s1.email")
        await expect(notify).to_contain_text("done")
        link = notify.locator("a.item-link")
        await expect(link).to_contain_text(f"in {NOTIFICATIONS_OUTBOX}")
        href = await link.get_attribute("href")
        assert href is not None and href.startswith(f"/#/outboxes/{NOTIFICATIONS_OUTBOX}/items/")
        # Nothing left to change the ledger, so no row is built again under the click.
        await expect(page.locator("#effects-summary")).to_contain_text("0 pending")

        await link.click()
        # The dashboard opens that item: the same key, the email destination, its status.
        key = href.rsplit("/", 1)[1]
        detail = page.locator("#detail")
        await expect(detail).to_contain_text(EMAIL_DESTINATION)
        await expect(detail).to_contain_text(urllib.parse.unquote(key))
