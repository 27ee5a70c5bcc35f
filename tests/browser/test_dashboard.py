"""The dashboard in a real browser: an item enqueued through the API appears and turns `sent`
without a reload, and its detail shows the event history."""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from durable_outbox_temporal.codec import new_key_setting
from durable_outbox_temporal.contract.flow import flow_workflow_id
from playwright.async_api import Browser, Page, expect
from temporalio.service import RPCError

from api.main import create_app
from configuration.version import VERSION
from devstack.fake_provider import run_fake_provider
from devstack.serving import serve_in_background
from tests.api.conftest import api_settings, serve_stack
from tests.api.test_read_model_encryption import database_bytes
from tests.browser.conftest import ARTIFACTS, accept_dialogs, reload_until
from tests.conftest import email_destination, webhook_destination


async def dashboard_on_one_sent_item(api: Any, browser: Browser, outbox: str) -> Page:
    """The dashboard, live on `outbox`, which holds one item, sent."""
    async with httpx.AsyncClient(base_url=api.url) as http:
        first = await http.post(
            f"/v1/outboxes/{outbox}/items",
            json={"destination": api.webhook.name, "payload": {"n": 0}},
            headers={"Idempotency-Key": "seed"},
        )
        await api.stack.result(first.json()["id"])
    page = await browser.new_page()
    await page.goto(api.url + "/")
    await expect(page.locator("#live")).to_have_text(f"live: {outbox}", timeout=10_000)
    return page


async def test_row_appears_and_turns_sent_without_reload(
    served_api_factory, browser: Browser
) -> None:
    api = await served_api_factory()
    page = await dashboard_on_one_sent_item(api, browser, "demo")
    loads = []
    page.on("load", lambda _: loads.append(1))

    async with httpx.AsyncClient(base_url=api.url) as http:
        response = await http.post(
            "/v1/outboxes/demo/items",
            json={"destination": api.webhook.name, "payload": {"order": 42}},
            headers={"Idempotency-Key": "order-42"},
        )
    assert response.status_code == 202
    row = page.locator("tr.item[data-key='order-42']")
    await expect(row.locator(".status")).to_have_text("sent", timeout=15_000)
    await expect(page.locator("#counts")).to_have_text("sent: 2", timeout=5_000)
    await row.click()
    await expect(page.locator("#detail-status")).to_have_text("sent")
    await expect(page.locator("#detail")).to_contain_text("enqueued")
    await expect(page.locator("#detail")).to_contain_text('"order": 42')
    await page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)

    assert loads == []  # the row changed without the page reloading


async def test_a_burst_of_events_is_read_in_a_few_requests_not_one_per_event(
    served_api_factory, browser: Browser
) -> None:
    """Each live event's row was read again on its own (a running item's read is a query to its
    workflow): a batch of 40 items sent the API 40 requests from each open page. Rows changed
    together are read in batches a few times a second, and a burst that changes more than a
    few reads the page once instead."""
    burst = 40
    api = await served_api_factory()
    page = await dashboard_on_one_sent_item(api, browser, "burst")
    item_reads: list[str] = []
    page.on(
        "request",
        lambda request: (
            item_reads.append(request.url) if "/v1/outboxes/burst/items/" in request.url else None
        ),
    )

    # Held for an hour: one event each (`queued`), all at once.
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    items = [
        {
            "destination": api.webhook.name,
            "payload": {"n": n},
            "idempotency_key": f"b-{n}",
            "not_before": later,
        }
        for n in range(burst)
    ]
    async with httpx.AsyncClient(base_url=api.url) as http:
        response = await http.post("/v1/outboxes/burst/items:batch", json={"items": items})
    assert response.status_code == 200, response.text

    await expect(page.locator("tr.item .status-queued")).to_have_count(burst, timeout=15_000)
    await expect(page.locator("tr.item")).to_have_count(burst + 1)
    await page.wait_for_timeout(1_000)
    assert len(item_reads) < burst // 2, len(item_reads)


async def test_enqueue_form_creates_an_item(served_api_factory, browser: Browser) -> None:
    api = await served_api_factory()
    page = await browser.new_page()
    await page.goto(api.url + "/")
    # The release the API runs, as /healthz says it.
    await expect(page.locator("#version")).to_have_text(f"v{VERSION}", timeout=10_000)
    await expect(page.locator("#enqueue-destination option")).to_have_count(1, timeout=10_000)

    await page.fill("#enqueue-outbox", "forms")
    await page.fill("#enqueue-payload", '{"from": "browser"}')
    await page.click("#enqueue-button")

    await expect(page.locator("#enqueue-result")).to_contain_text("enqueued", timeout=10_000)
    await expect(page.locator("tr.item .status").first).to_have_text("sent", timeout=15_000)


async def test_recipients_delivery_shows_from_the_providers_reports(
    stack_factory, browser: Browser, monkeypatch
) -> None:
    """With payload keys, as in production: the read model holds the addresses sealed, and the
    dashboard shows them decrypted."""
    monkeypatch.setenv("PAYLOAD_KEYS", new_key_setting("dash"))
    secret = "browser-events-secret-0123"
    async with contextlib.AsyncExitStack() as running:
        fake = await running.enter_async_context(run_fake_provider())
        email = email_destination(fake, events_secret=secret, report_window_s=3600)
        stack = await stack_factory(email)
        settings = api_settings(workflow_task_queue=stack.task_queue)
        app = create_app(settings, outbox_client=stack.outbox, engine=stack.engine)
        url = await running.enter_async_context(serve_in_background(app, lifespan="on"))
        await fake.admin.set_faults(
            report_url=f"{url}/v1/destinations/{email.name}/events?secret={secret}"
        )
        page = await browser.new_page()
        async with httpx.AsyncClient(base_url=url) as http:
            response = await http.post(
                "/v1/outboxes/mail/items",
                json={
                    "destination": email.name,
                    "payload": {
                        "senderAddress": "noreply@example.com",
                        "recipients": {
                            "to": [{"address": "ada@example.com"}],
                            "cc": [{"address": "bounce@example.com"}],
                        },
                        "content": {"subject": "Hi", "plainText": "Hello"},
                    },
                },
                headers={"Idempotency-Key": "welcome"},
            )
            assert response.status_code == 202
            # The page lists the outboxes the read model holds when it loads: wait for this one.
            for _ in range(200):
                if any(o["outbox"] == "mail" for o in (await http.get("/v1/outboxes")).json()):
                    break
                await asyncio.sleep(0.05)
        await page.goto(url + "/")

        row = page.locator("tr.item[data-key='welcome']")
        await expect(row.locator(".delivery-bounced")).to_have_text("bounced", timeout=20_000)
        await row.click()
        recipients = page.locator("#recipients")
        await expect(recipients.locator("tr[data-address='ada@example.com']")).to_contain_text(
            "delivered"
        )
        await expect(recipients.locator("tr[data-address='bounce@example.com']")).to_contain_text(
            "bounced"
        )
        await expect(page.locator("#detail")).to_contain_text("noreply@example.com")
        await page.select_option("#delivery-filter", "delivered")
        await expect(page.locator("tr.item")).to_have_count(0)
        await page.select_option("#delivery-filter", "bounced")
        await expect(page.locator("tr.item")).to_have_count(1)
        await page.screenshot(path=str(ARTIFACTS / "dashboard-recipients.png"), full_page=True)
        assert b"bounce@example.com" not in database_bytes(stack.engine)


async def test_aggregates_page_sends_commands_and_shows_events_live(
    served_api_factory, browser: Browser
) -> None:
    api = await served_api_factory()
    page = await browser.new_page()
    await page.goto(api.url + "/aggregates")
    await expect(page.locator("#types li.active")).to_have_text("flight", timeout=10_000)

    await page.fill("#open-id", "BA117")
    await page.click("#open-form button")
    await page.select_option("#command-name", "open")
    await page.fill("#command-payload", '{"seats": ["1A", "1B"]}')
    await page.click("#command-button")
    await expect(page.locator("#command-result")).to_have_text("version 1: FlightOpened")
    await page.select_option("#command-name", "assign_seat")
    await page.fill("#command-payload", '{"seat": "1A", "passenger_id": "p1"}')
    await page.click("#command-button")

    await expect(page.locator("#events tr[data-seq='2']")).to_contain_text(
        "SeatAssigned", timeout=10_000
    )
    await expect(page.locator("#state")).to_contain_text('"1A": "p1"')
    await expect(page.locator("#version")).to_have_text("version 2")
    await page.fill("#command-payload", '{"seat": "1A", "passenger_id": "p2"}')
    await page.click("#command-button")
    await expect(page.locator("#command-result")).to_contain_text("SeatTaken")
    await page.screenshot(path=str(ARTIFACTS / "aggregates.png"), full_page=True)


async def test_an_empty_dashboard_picks_up_the_first_outbox(
    served_api_factory, browser: Browser
) -> None:
    api = await served_api_factory()
    page = await browser.new_page()
    await page.goto(api.url + "/")
    await expect(page.locator("#enqueue-destination option")).to_have_count(1, timeout=10_000)

    async with httpx.AsyncClient(base_url=api.url) as http:
        response = await http.post(
            "/v1/outboxes/first/items",
            json={"destination": api.webhook.name, "payload": {"n": 1}},
            headers={"Idempotency-Key": "first-1"},
        )
    assert response.status_code == 202

    await expect(page.locator("#outboxes li")).to_have_text(["first (1)"], timeout=10_000)
    await expect(page.locator("tr.item[data-key='first-1']")).to_have_count(1, timeout=10_000)


async def test_pause_button_pauses_and_resumes_a_destination(
    dev_env, stack_factory, fake_provider, browser: Browser
) -> None:
    webhook = webhook_destination(fake_provider)
    stack = await stack_factory(webhook, env=dev_env)
    async with serve_stack(stack) as url:
        page = await browser.new_page()
        await page.goto(url + "/")
        row = page.locator(f"#destinations [data-destination='{webhook.name}']")
        await expect(row.locator(".pause-button")).to_have_text("Pause", timeout=10_000)

        await row.locator(".pause-button").click()
        await expect(row).to_contain_text("paused: from the dashboard")
        async with httpx.AsyncClient(base_url=url) as http:
            state = (await http.get(f"/v1/destinations/{webhook.name}")).json()
            assert state["paused"] is True
            await row.locator(".pause-button").click()
            await expect(row.locator(".pause-button")).to_have_text("Pause")
            assert (await http.get(f"/v1/destinations/{webhook.name}")).json()["paused"] is False


async def test_purge_button_cancels_the_outboxs_waiting_items(
    dev_env, stack_factory, fake_provider, browser: Browser
) -> None:
    webhook = webhook_destination(fake_provider)
    stack = await stack_factory(webhook, env=dev_env)
    async with serve_stack(stack) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            response = await http.post(
                "/v1/outboxes/later/items",
                json={"destination": webhook.name, "payload": {}, "delay_seconds": 3600},
                headers={"Idempotency-Key": "tomorrow"},
            )
            assert response.status_code == 202
        query = "WorkflowId = 'outbox/later/tomorrow' AND OutboxStatus = 'queued'"
        for _ in range(100):  # the purge lists from visibility, which trails the start
            if [run async for run in stack.client.list_workflows(query)]:
                break
            await asyncio.sleep(0.1)
        page = await browser.new_page()
        accept_dialogs(page)
        await page.goto(url + "/")
        # The delayed item has no read-model row until it runs, so no outbox is listed yet:
        # point the page at it as a click on the outbox would.
        await page.evaluate("state.outbox = 'later'")
        await page.click("#purge-button")

        # The purge is a batch workflow on the operations queue that lists, then signals each
        # item: under a full run's load on two cores it once took longer than 10 s.
        deadline = time.monotonic() + 60
        async with httpx.AsyncClient(base_url=url) as http:
            while True:
                item = (await http.get("/v1/outboxes/later/items/tomorrow")).json()
                if item["status"] == "cancelled" or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
        assert item["status"] == "cancelled"


async def test_a_throttled_destination_says_until_when_and_that_it_resumes_by_itself(
    dev_env, stack_factory, fake_provider, browser: Browser
) -> None:
    webhook = webhook_destination(fake_provider)
    stack = await stack_factory(webhook, env=dev_env)
    await fake_provider.admin.set_endpoint_fault(webhook.name, status=429, retry_after="30")
    try:
        async with serve_stack(stack) as url, httpx.AsyncClient(base_url=url) as http:
            enqueued = await http.post(
                "/v1/outboxes/tests/items",
                json={"destination": webhook.name, "payload": {"n": 1}},
                headers={"Idempotency-Key": "throttled-1"},
            )
            assert enqueued.status_code == 202
            page = await browser.new_page()
            await page.goto(url + "/")
            row = page.locator(f"#destinations [data-destination='{webhook.name}']")
            await reload_until(page, row, "throttled until")
            await expect(row).to_contain_text("resumes by itself")
            # The item says why it waits (until the throttle's end, or its own Retry-After).
            await page.click("tr.item[data-key='throttled-1']")
            waiting = page.locator("#detail-waiting")
            await expect(waiting).to_contain_text("Waiting: ", timeout=10_000)
            await expect(waiting).to_contain_text("until")
            state = (await http.get(f"/v1/destinations/{webhook.name}")).json()
            assert state["paused_until"] is not None and state["flow"]["storms"] == 1
    finally:
        await fake_provider.admin.clear_endpoint_fault(webhook.name)
        with contextlib.suppress(RPCError):
            await stack.client.get_workflow_handle(flow_workflow_id(webhook.name)).terminate()


async def test_a_destination_whose_circuit_is_open_says_so(
    dev_env, stack_factory, fake_provider, browser: Browser
) -> None:
    webhook = webhook_destination(
        fake_provider,
        backoff_initial_s=0.2,
        # One failure opens it, and no probe comes while the test looks.
        flow={"breaker_min_failures": 1, "breaker_probe_interval_s": 600},
    )
    stack = await stack_factory(webhook, env=dev_env)
    await fake_provider.admin.set_endpoint_fault(webhook.name, status=500)
    try:
        async with serve_stack(stack) as url, httpx.AsyncClient(base_url=url) as http:
            enqueued = await http.post(
                "/v1/outboxes/tests/items",
                json={"destination": webhook.name, "payload": {"n": 1}},
                headers={"Idempotency-Key": "circuit-1"},
            )
            assert enqueued.status_code == 202
            page = await browser.new_page()
            await page.goto(url + "/")
            row = page.locator(f"#destinations [data-destination='{webhook.name}']")
            await reload_until(page, row, "circuit open")
            await expect(row).to_contain_text("closes when a probe succeeds")
            await page.click("tr.item[data-key='circuit-1']")
            waiting = page.locator("#detail-waiting")
            await expect(waiting).to_contain_text("circuit is open", timeout=10_000)
    finally:
        await fake_provider.admin.clear_endpoint_fault(webhook.name)
        with contextlib.suppress(RPCError):
            await stack.client.get_workflow_handle(flow_workflow_id(webhook.name)).terminate()
