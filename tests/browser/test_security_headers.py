"""The dashboard and the aggregates page work in Chromium under their strict
Content-Security-Policy: nothing is blocked, the live socket and the pages' own scripts run. The
API docs are checked under it where they are rendered offline (`test_api_docs_offline.py`): one
render of each, for the policy and the loopback-only network at once."""

from __future__ import annotations

from playwright.async_api import Browser, Route, expect

from api.security import CONTENT_SECURITY_POLICY
from tests.browser.conftest import csp_violations, watched_page


async def test_the_dashboard_works_with_nothing_blocked(
    served_api_factory, browser: Browser
) -> None:
    api = await served_api_factory()
    page, console = await watched_page(browser)
    response = await page.goto(api.url + "/")
    assert response is not None
    assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert response.headers["x-content-type-options"] == "nosniff"
    await expect(page.locator("#enqueue-destination option")).to_have_count(1, timeout=10_000)

    # Its script runs the form, and its live socket (connect-src 'self') shows the item.
    await page.fill("#enqueue-outbox", "csp")
    await page.fill("#enqueue-payload", '{"under": "csp"}')
    await page.click("#enqueue-button")
    await expect(page.locator("#enqueue-result")).to_contain_text("enqueued", timeout=10_000)
    await expect(page.locator("#live")).to_have_text("live: csp", timeout=10_000)
    await expect(page.locator("tr.item .status").first).to_have_text("sent", timeout=15_000)
    # Its stylesheet applies: the header bar is dark, as dashboard.css says.
    background = await page.evaluate(
        "getComputedStyle(document.querySelector('header')).backgroundColor"
    )
    assert background == "rgb(17, 24, 39)"

    assert await csp_violations(page, console) == []


async def test_the_aggregates_page_works_with_nothing_blocked(
    served_api_factory, browser: Browser
) -> None:
    api = await served_api_factory()
    page, console = await watched_page(browser)
    await page.goto(api.url + "/aggregates")
    await expect(page.locator("#types li.active")).to_have_text("flight", timeout=10_000)

    assert await csp_violations(page, console) == []


async def test_an_inline_script_would_not_run(served_api_factory, browser: Browser) -> None:
    """The policy is really enforced: a script injected into the page's HTML is refused."""
    api = await served_api_factory()
    page, console = await watched_page(browser)

    async def with_injected_script(route: Route) -> None:
        upstream = await route.fetch()
        body = (await upstream.text()).replace(
            "</body>", "<script>window.__ran = 1</script></body>"
        )
        await route.fulfill(response=upstream, body=body)

    await page.route(api.url + "/", with_injected_script)
    await page.goto(api.url + "/")
    await expect(page.locator("#enqueue-destination option")).to_have_count(1, timeout=10_000)

    assert await page.evaluate("window.__ran") is None
    assert any("script-src" in violation for violation in await csp_violations(page, console))
