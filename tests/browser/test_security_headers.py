"""The dashboard, the aggregates page and the API docs work in Chromium under their strict
Content-Security-Policy: nothing is blocked, the live socket and the pages' own scripts run."""

from __future__ import annotations

import pytest
from playwright.async_api import Browser, Page, Route, expect

from api.security import CONTENT_SECURITY_POLICY

# Registered before any of the page's scripts; DevTools injects it, so the policy allows it.
_RECORD_VIOLATIONS = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__violations.push(`${event.violatedDirective} ${event.blockedURI}`);
});
"""


async def _watched_page(browser: Browser) -> tuple[Page, list[str]]:
    page = await browser.new_page()
    await page.add_init_script(_RECORD_VIOLATIONS)
    console = []
    page.on(
        "console",
        lambda message: (
            console.append(message.text) if "Content Security Policy" in message.text else None
        ),
    )
    return page, console


# Redoc's sidebar badge loads its logo from Redocly's CDN: the policy keeps the page from
# calling out, and the page works without the picture.
_EXPECTED_BLOCKS = ("https://cdn.redoc.ly/",)


async def _violations(page: Page, console: list[str]) -> list[str]:
    recorded: list[str] = await page.evaluate("window.__violations")
    return [
        violation
        for violation in recorded + console
        if not any(blocked in violation for blocked in _EXPECTED_BLOCKS)
    ]


async def test_the_dashboard_works_with_nothing_blocked(
    served_api_factory, browser: Browser
) -> None:
    api = await served_api_factory()
    page, console = await _watched_page(browser)
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

    assert await _violations(page, console) == []


async def test_the_aggregates_page_works_with_nothing_blocked(
    served_api_factory, browser: Browser
) -> None:
    api = await served_api_factory()
    page, console = await _watched_page(browser)
    await page.goto(api.url + "/aggregates")
    await expect(page.locator("#types li.active")).to_have_text("flight", timeout=10_000)

    assert await _violations(page, console) == []


# Redoc lays out the whole schema before it shows any of it: slow on a loaded machine.
@pytest.mark.parametrize(
    ("path", "rendered"), [("/docs", ".opblock"), ("/redoc", "h2:has-text('Enqueue one item')")]
)
async def test_the_api_docs_render_with_nothing_blocked(
    served_api_factory, browser: Browser, path: str, rendered: str
) -> None:
    api = await served_api_factory()
    page, console = await _watched_page(browser)
    await page.goto(api.url + path)
    await expect(page.locator(rendered).first).to_be_visible(timeout=45_000)

    assert await _violations(page, console) == []


async def test_an_inline_script_would_not_run(served_api_factory, browser: Browser) -> None:
    """The policy is really enforced: a script injected into the page's HTML is refused."""
    api = await served_api_factory()
    page, console = await _watched_page(browser)

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
    assert any("script-src" in violation for violation in await _violations(page, console))
