"""An `http` (payment) destination through the API: a body over its `max_body_bytes` is a 413 at
enqueue, a payload without a field its URL names a 422, never a failed delivery; a payment goes
out once and a declined card fails the item permanently with the provider's code."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest_asyncio

from devstack.fake_payments import DECLINED_METHOD
from devstack.fake_provider import FakeProvider
from tests.api.conftest import api_settings, open_api
from tests.api.test_items import assert_problem
from tests.conftest import Stack, payment_destination

ITEMS = "/v1/outboxes/pay/items"
MAX_BODY_BYTES = 200


def payment(**fields: Any) -> dict[str, Any]:
    return {"amount": 2000, "currency": "eur", "payment_method": "pm_card_visa", **fields}


@dataclass
class PaymentApi:
    http: httpx.AsyncClient
    stack: Stack
    fake: FakeProvider
    destination: str

    async def enqueue(self, key: str, payload: dict[str, Any]) -> httpx.Response:
        return await self.http.post(
            ITEMS,
            json={"destination": self.destination, "payload": payload},
            headers={"Idempotency-Key": key},
        )

    async def ended(self, key: str) -> dict[str, Any]:
        for _ in range(200):
            item = dict((await self.http.get(f"{ITEMS}/{key}")).json())
            if item["status"] in ("sent", "failed"):
                return item
            await asyncio.sleep(0.05)
        raise AssertionError(f"{key}: {item}")


@pytest_asyncio.fixture(loop_scope="session")
async def payment_api(stack_factory, fake_provider) -> AsyncIterator[PaymentApi]:
    destination = payment_destination(
        fake_provider,
        settings={
            "url": f"{fake_provider.url}/payments?customer={{payload.customer}}",
            "max_body_bytes": MAX_BODY_BYTES,
        },
    )
    stack = await stack_factory(destination)
    async for http in open_api(stack, api_settings(workflow_task_queue=stack.task_queue)):
        yield PaymentApi(http=http, stack=stack, fake=fake_provider, destination=destination.name)


async def test_a_body_over_max_body_bytes_is_413_at_enqueue(payment_api: PaymentApi) -> None:
    key = f"big-{uuid.uuid4().hex[:8]}"

    response = await payment_api.enqueue(key, payment(customer="c1", note="x" * MAX_BODY_BYTES))

    detail = assert_problem(response, 413, "request-too-large")["detail"]
    assert f"the destination takes at most {MAX_BODY_BYTES}" in detail
    assert (await payment_api.http.get(f"{ITEMS}/{key}")).status_code == 404


async def test_a_payload_without_a_field_the_url_names_is_422_naming_it(
    payment_api: PaymentApi,
) -> None:
    key = f"nofield-{uuid.uuid4().hex[:8]}"

    response = await payment_api.enqueue(key, payment())

    detail = assert_problem(response, 422, "invalid-request")["detail"]
    assert "payload.customer must be a non-empty string or an integer" in detail


async def test_a_payment_is_made_once_and_ends_sent(payment_api: PaymentApi) -> None:
    key = f"pay-{uuid.uuid4().hex[:8]}"

    assert (await payment_api.enqueue(key, payment(customer="c 1"))).status_code == 202
    item = await payment_api.ended(key)

    assert item["status"] == "sent", item
    made = [
        entry
        for entry in await payment_api.fake.admin.deliveries("payments")
        if entry["payload"] == payment(customer="c 1")
    ]
    assert len(made) == 1


async def test_a_declined_card_fails_the_item_with_the_providers_code(
    payment_api: PaymentApi,
) -> None:
    key = f"declined-{uuid.uuid4().hex[:8]}"

    await payment_api.enqueue(key, payment(customer="c2", payment_method=DECLINED_METHOD))
    item = await payment_api.ended(key)

    assert item["status"] == "failed"
    assert "HTTP 402" in item["last_error"] and "card_declined" in item["last_error"]
