"""`/docs` (Swagger UI) and `/redoc` work with no internet and under their strict
Content-Security-Policy: the pages load their scripts and styles from the API itself, and render
the API's operations in a browser that can reach nothing but the loopback address, with nothing
blocked by the policy. Each page is rendered once for both checks: a render is seconds of
Chromium's CPU (docs/decisions/parallel-tests.md)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx
import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, Route, expect

from api.main import create_app
from api.routes.docs import ASSETS_PATH, OWN_ASSETS
from api.security import DOCS_CONTENT_SECURITY_POLICY
from devstack.serving import serve_in_background
from tests.api.conftest import api_settings
from tests.browser.conftest import ARTIFACTS, csp_violations, watched_page

# Every URL a page names: attributes, and JavaScript or CSS string values.
_URL = re.compile(r"""(?:src|href|url)\s*[=:(]\s*["']?([^"')\s>]+)""")
_CONTENT_TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def docs_url() -> AsyncIterator[str]:
    # The docs need no Temporal and no database: the app without its lifespan serves them.
    # The tests only read from it, so the module's tests share one (and its schema, built once).
    async with serve_in_background(create_app(api_settings())) as url:
        yield url


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_the_page_names_only_the_apis_own_files_and_they_are_served(
    docs_url: str, page: str
) -> None:
    async with httpx.AsyncClient(base_url=docs_url) as http:
        response = await http.get(page)
        urls = _URL.findall(response.text)
        assets = [url for url in urls if url.startswith(f"{ASSETS_PATH}/")]
        served = {url: await http.get(url) for url in assets}

    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    assert "http://" not in response.text and "https://" not in response.text
    assert set(urls) - set(assets) == {"/openapi.json"}
    assert any(url.endswith(".js") for url in assets)
    for url, asset in served.items():
        expected = _CONTENT_TYPES[url[url.rindex(".") :]]
        assert asset.status_code == 200, url
        assert asset.headers["content-type"].startswith(expected), (url, asset.headers)
        # The bundles are large; our own start-up script and stylesheet are a few lines.
        own = (OWN_ASSETS / url.rsplit("/", 1)[1]).exists()
        assert len(asset.content) > (0 if own else 1000), url


async def test_the_docs_are_open_when_the_api_requires_a_token() -> None:
    app = create_app(api_settings(api_token="s3cret-token"))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
        pages = [await http.get(path) for path in ("/docs", "/redoc", "/openapi.json")]
        script = await http.get(f"{ASSETS_PATH}/swagger-ui-bundle.js")
        guarded = await http.get("/v1/token")

    assert [page.status_code for page in pages] == [200, 200, 200]
    assert script.status_code == 200
    assert guarded.status_code == 401


async def _offline_page(browser: Browser) -> tuple[Page, list[str], list[str]]:
    """A page whose requests to anything but 127.0.0.1 fail, as they would with no internet; it
    records what its Content-Security-Policy blocks (`csp_violations`)."""
    page, console = await watched_page(browser)
    blocked: list[str] = []

    async def only_loopback(route: Route) -> None:
        if urlsplit(route.request.url).hostname == "127.0.0.1":
            await route.continue_()
        else:
            blocked.append(route.request.url)
            await route.abort("internetdisconnected")

    await page.route("**/*", only_loopback)
    return page, blocked, console


async def _open(page: Page, url: str) -> None:
    response = await page.goto(url)
    assert response is not None
    assert response.headers["content-security-policy"] == DOCS_CONTENT_SECURITY_POLICY


async def test_swagger_ui_renders_the_operations_offline(docs_url: str, browser: Browser) -> None:
    page, blocked, console = await _offline_page(browser)
    try:
        await _open(page, f"{docs_url}/docs")
        operations = page.locator(".opblock")
        # As ReDoc's below: a fresh-clone CI on a slower 2-core machine saw it still loading
        # after 15 s.
        await expect(operations.first).to_be_visible(timeout=45_000)
        await expect(
            page.locator(".opblock-summary-path", has_text="/v1/outboxes/{outbox}/items").first
        ).to_be_visible()
        count = await operations.count()
        await page.screenshot(path=str(ARTIFACTS / "api-docs-swagger.png"))
        violations = await csp_violations(page, console)
    finally:
        await page.close()

    async with httpx.AsyncClient(base_url=docs_url) as http:
        schema = (await http.get("/openapi.json")).json()
    assert count == sum(len(operations) for operations in schema["paths"].values())
    assert blocked == []
    assert violations == []


async def test_redoc_renders_the_operations_offline(docs_url: str, browser: Browser) -> None:
    page, blocked, console = await _offline_page(browser)
    try:
        await _open(page, f"{docs_url}/redoc")
        heading = page.locator("h2", has_text="Enqueue one item")
        # ReDoc lays out the whole schema before it shows any of it: on a loaded 2-core
        # machine that took over 15 s once.
        await expect(heading.first).to_be_visible(timeout=45_000)
        await page.screenshot(path=str(ARTIFACTS / "api-docs-redoc.png"))
        violations = await csp_violations(page, console)
    finally:
        await page.close()

    # Redoc's own footer logo is the one request it makes elsewhere; it hides the image on error.
    assert set(blocked) <= {"https://cdn.redoc.ly/redoc/logo-mini.svg"}, blocked
    assert violations == []
