"""The fake provider's per-endpoint faults: one webhook endpoint answers 410 until cleared."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

import httpx
from standardwebhooks import Webhook

from devstack.fake_provider import run_fake_provider
from tests.conftest import WEBHOOK_SECRET


async def post(http: httpx.AsyncClient, url: str, endpoint: str) -> int:
    body, stamp, key = '{"n":1}', int(time.time()), uuid.uuid4().hex
    signature = Webhook(WEBHOOK_SECRET).sign(key, datetime.fromtimestamp(stamp, UTC), body)
    response = await http.post(
        f"{url}/webhook/{endpoint}",
        content=body,
        headers={
            "webhook-id": key,
            "webhook-timestamp": str(stamp),
            "webhook-signature": signature,
        },
    )
    return response.status_code


async def test_an_endpoint_fault_holds_for_that_endpoint_until_cleared() -> None:
    async with run_fake_provider() as fake, httpx.AsyncClient() as http:
        await fake.admin.set_endpoint_fault("gone/one", status=410)

        while_set = [await post(http, fake.url, "gone/one") for _ in range(3)]
        other = await post(http, fake.url, "gone/two")
        await fake.admin.clear_endpoint_fault("gone/one")
        after_clear = await post(http, fake.url, "gone/one")
        await fake.admin.set_endpoint_fault("gone/one", status=410)
        await fake.admin.reset()
        after_reset = await post(http, fake.url, "gone/one")
        bad = await http.put(f"{fake.url}/_admin/endpoints/x", json={"no_such_field": 1})

        assert while_set == [410, 410, 410]
        assert other == 204 and after_clear == 204 and after_reset == 204
        assert bad.status_code == 422
        assert [entry["endpoint"] for entry in await fake.admin.deliveries()] == ["gone/one"]
