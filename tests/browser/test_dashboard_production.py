"""The dashboard as production runs it: tokens in a tokens file only (no `API_TOKEN`). Before a
token it says where one goes, not just "Unauthorized"; any valid token then fills every pane;
and its test-item form starts from a body the chosen destination's provider accepts, so the
item it enqueues is delivered as it stands."""

from __future__ import annotations

import hashlib
import json

from playwright.async_api import Browser, expect

from tests.conftest import email_destination, payment_destination, sms_destination

TOKEN = "a-tokens-file-token"


async def test_a_tokens_file_token_fills_the_dashboard_and_each_sample_body_is_delivered(
    served_api_factory, fake_provider, browser: Browser, tmp_path
) -> None:
    tokens = tmp_path / "tokens.toml"
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    tokens.write_text(
        f'[tokens.operator]\nsha256 = "{digest}"\nscopes = ["read", "enqueue", "operate"]\n'
    )
    email, sms = email_destination(fake_provider), sms_destination(fake_provider)
    payments = payment_destination(fake_provider)
    api = await served_api_factory(destinations=[email, sms, payments], api_tokens_file=str(tokens))
    page = await browser.new_page()
    await page.goto(api.url + "/")

    await expect(page.locator("#live")).to_contain_text("needs a token", timeout=10_000)
    placeholder = await page.get_attribute("#token", "placeholder")
    assert placeholder is not None and "tokens file" in placeholder
    await page.fill("#token", TOKEN)
    await page.dispatch_event("#token", "change")
    await expect(page.locator("#enqueue-destination option")).to_have_count(4, timeout=10_000)

    bodies = {}
    for destination in (email, sms, payments, api.webhook):
        await page.select_option("#enqueue-destination", destination.name)
        bodies[destination.provider] = json.loads(await page.input_value("#enqueue-payload"))
        await page.fill("#enqueue-outbox", f"forms-{destination.provider}")
        await page.click("#enqueue-button")
        await expect(page.locator("#enqueue-result")).to_contain_text("enqueued", timeout=10_000)
        row = page.locator("tr.item").first
        await expect(row.locator(".status")).to_have_text("sent", timeout=20_000)

    assert bodies["acs-email"]["recipients"]["to"][0]["address"]
    assert bodies["acs-email"]["senderAddress"] and bodies["acs-email"]["content"]["subject"]
    assert bodies["acs-sms"]["smsRecipients"][0]["to"].startswith("+")
    assert bodies["acs-sms"]["from"].startswith("+") and bodies["acs-sms"]["message"]
    assert bodies["webhook"] == {"event": "dashboard.test"}
    assert bodies["http"]["amount"] and bodies["http"]["currency"]


async def test_an_edited_payload_stays_when_the_destination_changes(
    served_api_factory, fake_provider, browser: Browser
) -> None:
    email = email_destination(fake_provider)
    api = await served_api_factory(destinations=[email])
    page = await browser.new_page()
    await page.goto(api.url + "/")
    await expect(page.locator("#enqueue-destination option")).to_have_count(2, timeout=10_000)

    await page.select_option("#enqueue-destination", api.webhook.name)
    await page.fill("#enqueue-payload", '{"mine": true}')
    await page.select_option("#enqueue-destination", email.name)

    assert await page.input_value("#enqueue-payload") == '{"mine": true}'
