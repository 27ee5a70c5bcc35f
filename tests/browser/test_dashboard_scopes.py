"""The dashboard offers only what the token may do: a `read` token sees items but no enqueue
form and no operator buttons; an all-scopes token sees them all."""

from __future__ import annotations

import hashlib
import re

import httpx
from playwright.async_api import Browser, expect


async def test_a_read_only_token_sees_no_actions(
    served_api_factory, browser: Browser, tmp_path
) -> None:
    digest = hashlib.sha256(b"reader-token").hexdigest()
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f'[tokens.reader]\nsha256 = "{digest}"\nscopes = ["read"]\n')
    api = await served_api_factory(api_token="root-token", api_tokens_file=str(tokens))
    page = await browser.new_page()
    await page.goto(api.url + "/")

    await page.fill("#token", "reader-token")
    await page.dispatch_event("#token", "change")
    await expect(page.locator("#enqueue-form")).to_be_hidden(timeout=10_000)
    await expect(page.locator("#purge-button")).to_be_hidden()
    await expect(page.locator("#redrive-all")).to_be_hidden()

    await page.fill("#token", "root-token")
    await page.dispatch_event("#token", "change")
    await expect(page.locator("#enqueue-form")).to_be_visible(timeout=10_000)
    await expect(page.locator("#purge-button")).to_be_visible()


async def test_the_token_stays_in_the_tab_and_out_of_the_live_url(
    served_api_factory, browser: Browser
) -> None:
    api = await served_api_factory(api_token="root-token")
    async with httpx.AsyncClient(base_url=api.url) as http:
        enqueued = await http.post(
            "/v1/outboxes/scopes/items",
            json={"destination": api.webhook.name, "payload": {"n": 1}},
            headers={"Authorization": "Bearer root-token"},
        )
        assert enqueued.status_code == 202, enqueued.text
    page = await browser.new_page()
    sockets: list[str] = []
    page.on("websocket", lambda socket: sockets.append(socket.url))
    await page.goto(api.url + "/")

    await page.fill("#token", "root-token")
    await page.dispatch_event("#token", "change")

    # The live socket opens with the token as a subprotocol: the API refuses it otherwise.
    await expect(page.locator("#live")).to_have_text(re.compile(r"^live: "), timeout=10_000)
    assert sockets and not any("token" in url for url in sockets), sockets
    assert await page.evaluate("sessionStorage.getItem('outbox-token')") == "root-token"
    assert await page.evaluate("localStorage.getItem('outbox-token')") is None
