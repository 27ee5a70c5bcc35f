"""The fake provider's faults and counters: tests and benchmarks trust these numbers."""

from __future__ import annotations

import time

import httpx

from activities.providers.webhook import webhook_signature
from devstack.fake_provider import run_fake_provider
from tests.conftest import WEBHOOK_SECRET


async def post_webhook(
    http: httpx.AsyncClient, url: str, key: str, **headers: str
) -> httpx.Response:
    body = b'{"n":1}'
    stamp = int(time.time())
    return await http.post(
        f"{url}/webhook/test",
        content=body,
        headers={
            "webhook-id": key,
            "webhook-timestamp": str(stamp),
            "webhook-signature": webhook_signature(WEBHOOK_SECRET, key, stamp, body),
            **headers,
        },
    )


async def test_faults_scripts_dedupe_and_counters() -> None:
    async with run_fake_provider() as fake, httpx.AsyncClient() as http:
        await fake.admin.set_faults(error_rate=1.0, seed=1)
        assert (await post_webhook(http, fake.url, "k1")).status_code == 503
        await fake.admin.set_faults(throttle_rate=1.0, retry_after="30", retry_after_http_date=True)
        throttled = await post_webhook(http, fake.url, "k1")
        assert throttled.status_code == 429 and "GMT" in throttled.headers["retry-after"]
        assert (await post_webhook(http, fake.url, "k1")).status_code == 429
        await fake.admin.set_faults()
        await fake.admin.script("k2", [{"status": 500}])
        assert (await post_webhook(http, fake.url, "k2")).status_code == 500
        assert (await post_webhook(http, fake.url, "k2")).status_code == 204
        assert (await post_webhook(http, fake.url, "k2")).status_code == 204

        k1 = await fake.admin.key_stats("k1")
        k2 = await fake.admin.key_stats("k2")
        totals = (await fake.admin.stats())["totals"]

    assert (k1["submits"], k1["deliveries"], k1["early_requests"]) == (3, 0, 1)
    assert (k2["submits"], k2["deliveries"]) == (3, 1)
    assert totals["duplicates"] == 0


async def test_bad_signature_is_401_and_not_a_delivery() -> None:
    async with run_fake_provider() as fake, httpx.AsyncClient() as http:
        response = await post_webhook(http, fake.url, "k", **{"webhook-signature": "v1,AAAA"})
        stats = await fake.admin.key_stats("k")
    assert response.status_code == 401 and stats["deliveries"] == 0


async def test_max_rate_counts_requests_in_the_busiest_window() -> None:
    async with run_fake_provider() as fake, httpx.AsyncClient() as http:
        for n in range(7):
            await post_webhook(http, fake.url, f"burst-{n}")
        busiest = await fake.admin.max_rate("/webhook/test", 5.0)
        elsewhere = await fake.admin.max_rate("/webhook/other", 5.0)
        await fake.admin.reset()
        after_reset = await fake.admin.max_rate("/webhook/test", 5.0)
    assert (busiest, elsewhere, after_reset) == (7, 0, 0)
