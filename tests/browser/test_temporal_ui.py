"""The Temporal Web UI tells an item's and an aggregate's story on the workflow's page."""

from __future__ import annotations

import uuid
from urllib.parse import quote

from durable_outbox_temporal.aggregates import AggregateClient
from playwright.async_api import Browser, expect

from tests.browser.conftest import ARTIFACTS
from tests.conftest import DEV_UI_PORT, SEED_TYPES, webhook_destination
from worker import default_operations_task_queue


async def test_web_ui_shows_the_items_summary(
    dev_env, stack_factory, fake_provider, browser: Browser
) -> None:
    destination = webhook_destination(fake_provider)
    stack = await stack_factory(destination, env=dev_env)
    item = await stack.enqueue(destination, {"event": "invoice.paid"}, key="invoice-77")
    await stack.result(item.item_id)
    page = await browser.new_page()

    workflow_path = f"/namespaces/default/workflows/{quote(item.item_id, safe='')}"
    await page.goto(f"http://127.0.0.1:{DEV_UI_PORT}{workflow_path}")

    # This UI version shows the summary and current details under "User Metadata", each
    # rendered as markdown inside its own iframe.
    summary = f"Outbox tests: deliver via {destination.name} (key invoice-77)"
    try:
        await page.get_by_text("User Metadata").click(timeout=30_000)
        summary_frame = page.frame_locator("#user-metadata-summary")
        details_frame = page.frame_locator("#user-metadata-current-details")
        await expect(summary_frame.get_by_text(summary)).to_be_visible(timeout=15_000)
        await expect(details_frame.get_by_text("Sent: delivered.")).to_be_visible(timeout=15_000)
    finally:
        await page.screenshot(path=str(ARTIFACTS / "temporal-ui.png"), full_page=True)


async def test_web_ui_finds_an_aggregate_and_shows_its_state(
    dev_env, stack_factory, browser: Browser
) -> None:
    stack = await stack_factory(env=dev_env)
    aggregates = AggregateClient(stack.client, stack.task_queue, definitions=SEED_TYPES.definitions)
    flight = f"UI{uuid.uuid4().hex[:6]}"
    await aggregates.command("flight", flight, "open", {"seats": ["1A", "1B"]})
    await aggregates.send(
        "flight", flight, "assign_seat", {"seat": "9Z", "passenger_id": "p1"}, command_id="bad-1"
    )
    found = [
        run.id
        async for run in stack.client.list_workflows(
            f"AggregateType = 'flight' AND WorkflowId = 'agg/flight/{flight}'"
        )
    ]
    assert found == [f"agg/flight/{flight}"]
    page = await browser.new_page()

    workflow_path = f"/namespaces/default/workflows/{quote(found[0], safe='')}"
    await page.goto(f"http://127.0.0.1:{DEV_UI_PORT}{workflow_path}")

    try:
        await page.get_by_text("User Metadata").click(timeout=30_000)
        summary_frame = page.frame_locator("#user-metadata-summary")
        details_frame = page.frame_locator("#user-metadata-current-details")
        await expect(summary_frame.get_by_text(f"flight {flight}")).to_be_visible(timeout=15_000)
        await expect(details_frame.get_by_text("Rejected commands: 1")).to_be_visible(
            timeout=15_000
        )
    finally:
        await page.screenshot(path=str(ARTIFACTS / "temporal-ui-aggregate.png"), full_page=True)


async def test_web_ui_shows_a_labours_effect_ledger(
    dev_env, stack_factory, browser: Browser
) -> None:
    stack = await stack_factory(env=dev_env)
    aggregates = AggregateClient(
        stack.client,
        stack.task_queue,
        definitions=SEED_TYPES.definitions,
        operations_task_queue=default_operations_task_queue(stack.task_queue),
    )
    labour = f"UI{uuid.uuid4().hex[:6]}"
    await aggregates.command(
        "labour",
        labour,
        "plan_labour",
        {"actor": "m1", "mother_name": "Ada", "contact": {"email": "ada@example.com"}},
    )
    page = await browser.new_page()

    workflow_path = f"/namespaces/default/workflows/{quote(f'agg/labour/{labour}', safe='')}"
    await page.goto(f"http://127.0.0.1:{DEV_UI_PORT}{workflow_path}")

    try:
        await page.get_by_text("User Metadata").click(timeout=30_000)
        details_frame = page.frame_locator("#user-metadata-current-details")
        # The token policy's effect, run and recorded in the ledger the details show.
        await expect(
            details_frame.get_by_text("Effects: 0 pending, 1 done, 0 failed")
        ).to_be_visible(timeout=15_000)
    finally:
        await page.screenshot(path=str(ARTIFACTS / "temporal-ui-labour.png"), full_page=True)
