"""An adaptive destination learns a provider's hidden limit (dev server: queue config): its
submit rate falls from the ceiling on the provider's 429s, every item is delivered once, and the
destination view and the CLI show the rate in force and its moves (`flowcontrol/adaptive.py`)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from durable_outbox_temporal.contract.ids import item_workflow_id

from cli import _destination_fields
from tests.api.conftest import read_destination
from tests.api.test_destination_gone import eventually
from tests.api.test_throttle import api_with_flow
from tests.conftest import unique_name, webhook_destination
from tests.fakes import deliveries

ITEMS = 20


async def test_the_rate_falls_to_a_hidden_limit_and_every_item_goes_once(
    stack_factory, fake_provider, dev_env
) -> None:
    webhook = webhook_destination(
        fake_provider,
        submit_rate=20.0,
        max_attempts=30,
        backoff_initial_s=0.2,
        flow={"adaptive": True, "adaptive_floor": 1.0, "adaptive_interval_s": 0.5},
    )
    name = webhook.name
    stack = await stack_factory(webhook, env=dev_env)
    # The provider admits 5 submits a second, a quarter of the configured rate, and says 429
    # above it.
    await fake_provider.admin.set_hidden_limit(name, 5.0)
    try:
        async with api_with_flow(stack, fake_provider, name) as http:
            keys = [unique_name("adaptive") for _ in range(ITEMS)]
            batch = await http.post(
                "/v1/outboxes/tests/items:batch",
                json={
                    "items": [
                        {"destination": name, "payload": {"n": n}, "idempotency_key": key}
                        for n, key in enumerate(keys)
                    ]
                },
            )
            assert batch.json()["created"] == ITEMS, batch.text
            item_ids = [item_workflow_id("tests", key) for key in keys]
            views = await asyncio.gather(*(stack.result(item_id) for item_id in item_ids))

            async def destination() -> Any:
                return await read_destination(http, f"/v1/destinations/{name}")

            def settled(found: Any) -> bool:
                """The flow's state (a query, left out when no worker answers in time) has moves
                and has recorded the last rate it set on the server (a query answers from before
                a move's end until its workflow task completes), and no throttle pauses it."""
                adaptive = (found["flow"] or {}).get("adaptive")
                if not adaptive or not adaptive["history"]:
                    return False
                return bool(found["submit"]["rate"] == pytest.approx(adaptive["rate"]))

            found = await eventually(destination, settled, tries=300)
    finally:
        await fake_provider.admin.clear_hidden_limit(name)

    assert all(view.status == "sent" for view in views)
    assert [await deliveries(fake_provider, item_id) for item_id in item_ids] == [1] * ITEMS
    adaptive = found["flow"]["adaptive"]
    assert (adaptive["floor"], adaptive["ceiling"]) == (1.0, 20.0)
    # It fell from the ceiling on the 429s, and the server holds the queue to it.
    assert adaptive["rate"] < 20.0
    assert any(point["rate"] < 20.0 for point in adaptive["history"])
    assert found["submit"]["source"] == "api"
    # The server holds the queue to the rate the flow set (a 32-bit float there).
    assert found["submit"]["rate"] == pytest.approx(adaptive["rate"])
    assert "congested" in adaptive["history"][0]["reason"]
    shown = _destination_fields(found)
    assert f"{adaptive['rate']:g}/s between 1 and 20" in shown
