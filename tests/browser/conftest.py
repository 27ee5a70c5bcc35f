"""Headless Debian Chromium driven by Playwright (its own browser download cannot work here)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio
from playwright.async_api import Browser, Dialog, Locator, Page, async_playwright, expect
from playwright.async_api import Error as PlaywrightError

from tests.api.conftest import served_api_factory  # noqa: F401  (the app on a real port)

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
# Without the background-networking flags Chromium keeps dialling hosts this machine cannot reach.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


# Playwright's assertions wait 5 s by default. A dashboard action here waits on the API, the
# Temporal server and the read model on 2 cores shared with the rest of the suite: CI saw an
# item's detail (three GETs) take longer than that at a full run's loaded end.
expect.set_options(timeout=15_000)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def chromium() -> AsyncIterator[Browser]:
    """One Chromium for the process's browser tests."""
    executable = shutil.which("chromium") or "/usr/bin/chromium"
    assert Path(executable).exists(), "install Debian's chromium (.ci/run does)"
    ARTIFACTS.mkdir(exist_ok=True)
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield browser
        await browser.close()


@pytest_asyncio.fixture(loop_scope="session")
async def browser(chromium: Browser) -> AsyncIterator[Browser]:
    """The process's Chromium, with the pages a test opened closed after it (before the servers
    the test started stop): a page left open keeps running its timers and reconnecting its live
    socket, in Chromium and in whatever server later takes its port, for the rest of the run."""
    yield chromium
    for context in chromium.contexts:
        await context.close()


def accept_dialogs(page: Page) -> None:
    """Accept the page's `confirm()` dialogs. One still open when the test's pages are closed is
    left: its accept failed then, and the failure surfaced in the next test's first call on the
    browser (a full run, 2026-11-30)."""

    async def accept(dialog: Dialog) -> None:
        with contextlib.suppress(PlaywrightError):
            await dialog.accept()

    page.on("dialog", accept)


async def reload_until(page: Page, locator: Locator, text: str, reloads: int = 20) -> None:
    """Reload `page` until `locator` shows `text`: parts of the dashboard (the destinations,
    the health strip) read their state when the page loads."""
    for _ in range(reloads):
        await page.reload()
        with contextlib.suppress(AssertionError):
            await expect(locator).to_contain_text(text, timeout=500)
            return
    await expect(locator).to_contain_text(text)


# Registered before any of the page's scripts; DevTools injects it, so the policy allows it.
_RECORD_VIOLATIONS = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__violations.push(`${event.violatedDirective} ${event.blockedURI}`);
});
"""


async def watched_page(browser: Browser) -> tuple[Page, list[str]]:
    """A new page that records what its Content-Security-Policy blocks (`csp_violations`)."""
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


async def csp_violations(page: Page, console: list[str]) -> list[str]:
    """What the policy blocked on a `watched_page`, but for the blocks it is meant to make."""
    recorded: list[str] = await page.evaluate("window.__violations")
    return [
        violation
        for violation in recorded + console
        if not any(blocked in violation for blocked in _EXPECTED_BLOCKS)
    ]
