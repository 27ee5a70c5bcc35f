"""Flow rules changed at run time (`PATCH /v1/destinations/{name}` with `flow`) on the dev
server, measured at the fake provider: a cap lowered while items flow holds from then on, a
quota set at run time holds in every sliding window, the breaker turned off and on again,
bad values refused as the destinations file's are, and an override kept across a restart of
the API until `null` puts the file's value back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import pytest_asyncio

from devstack.fake_provider import FakeProvider
from readmodel.flow_overrides import REFRESH_S
from tests.api.conftest import api_settings, open_api, read_destination
from tests.api.test_destination_gone import eventually
from tests.api.test_items import assert_problem
from tests.api.test_throttle import api_with_flow
from tests.conftest import Stack, unique_name, webhook_destination

# After a change, every request that starts this much later is under it (each worker reads
# the overrides again at most every REFRESH_S before a request).
SETTLE_S = REFRESH_S + 0.5


@dataclass
class FlowApi:
    http: httpx.AsyncClient
    stack: Stack
    fake: FakeProvider
    webhook: str

    @property
    def url(self) -> str:
        return f"/v1/destinations/{self.webhook}"


@pytest_asyncio.fixture(loop_scope="session", params=["item", "bulk"])
async def flow_api(
    request: pytest.FixtureRequest, stack_factory: Any, fake_provider: FakeProvider, dev_env: Any
) -> AsyncIterator[FlowApi]:
    bulk = {"mode": "bulk", "shards": 2} if request.param == "bulk" else {}
    webhook = webhook_destination(
        fake_provider,
        submit_rate=100.0,
        max_attempts=2,
        backoff_initial_s=0.2,
        backoff_max_s=0.5,
        flow={"breaker_min_failures": 3, "breaker_window_s": 10.0, "breaker_probe_interval_s": 0.5},
        **bulk,
    )
    stack = await stack_factory(webhook, env=dev_env)
    async with api_with_flow(stack, fake_provider, webhook.name) as http:
        yield FlowApi(http, stack, fake_provider, webhook.name)


async def send(api: FlowApi, phase: str, count: int) -> list[str]:
    """Enqueue `count` items marked `phase` (the fake's counters filter on it)."""
    keys = [unique_name(phase) for _ in range(count)]
    batch = await api.http.post(
        "/v1/outboxes/tests/items:batch",
        json={
            "items": [
                {"destination": api.webhook, "payload": {"phase": phase}, "idempotency_key": k}
                for k in keys
            ]
        },
    )
    assert batch.status_code in (200, 207) and batch.json()["created"] == count, batch.text
    return keys


async def ended(api: FlowApi, keys: list[str]) -> list[str]:
    for _ in range(600):
        found = [(await api.http.get(f"/v1/outboxes/tests/items/{k}")).json() for k in keys]
        statuses = [item["status"] for item in found]
        if not {"queued", "sending"} & set(statuses):
            return statuses
        await asyncio.sleep(0.1)
    raise AssertionError(f"never ended: {statuses}")


async def held_reason(api: FlowApi, keys: list[str]) -> str:
    """The first `held` reason a queued item of `keys` gives in its `waiting_on`."""
    for _ in range(100):
        for key in keys:
            item = (await api.http.get(f"/v1/outboxes/tests/items/{key}")).json()
            for reason in item.get("waiting_on") or []:
                if reason["reason"] == "held":
                    return str(reason["detail"])
        await asyncio.sleep(0.05)
    raise AssertionError("no item said it was held")


async def patch_flow(api: FlowApi, **flow: Any) -> dict[str, Any]:
    response = await api.http.patch(api.url, json={"flow": flow})
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


async def test_a_cap_lowered_while_items_flow_holds_at_the_fake(flow_api: FlowApi) -> None:
    fake, prefix = flow_api.fake, f"/webhook/{flow_api.webhook}"
    # Each request stays out a while: without a cap, items overlap at the provider.
    await fake.admin.set_endpoint_fault(flow_api.webhook, latency_ms=300)
    # Without a cap, items go side by side at the provider (so a cap is what holds them later).
    free = await send(flow_api, "free", 8)
    assert await ended(flow_api, free) == ["sent"] * 8
    assert await fake.admin.max_in_flight(prefix, where={"phase": "free"}) > 1
    # Lowered while items flow ...
    during = await send(flow_api, "during", 8)
    patched = await patch_flow(flow_api, max_in_flight=1)
    assert patched["flow_policy"]["max_in_flight"] == {
        "value": 1,
        "source": "api",
        "changed_at": patched["flow_policy"]["max_in_flight"]["changed_at"],
    }
    assert patched["flow_policy"]["key_max_in_flight"]["source"] == "file"
    await asyncio.sleep(SETTLE_S)
    after = await send(flow_api, "after", 8)
    # A queued item says the cap holds it.
    held = await held_reason(flow_api, after)
    assert f"the concurrency cap of destination {flow_api.webhook} (1 out at once)" in held
    assert await ended(flow_api, during + after) == ["sent"] * 16
    # ... the cap held at the fake for what went once the change had settled.
    assert await fake.admin.max_in_flight(prefix, where={"phase": "after"}) == 1


async def test_a_quota_set_at_run_time_holds_and_null_lifts_it(flow_api: FlowApi) -> None:
    fake, prefix = flow_api.fake, f"/webhook/{flow_api.webhook}"
    # A window of 1 s: 8 items under the quota take about 2 s (3, 3, then 2).
    await patch_flow(flow_api, quotas=[{"per": "1s", "max": 3}])
    await asyncio.sleep(SETTLE_S)
    quota = await send(flow_api, "quota", 8)
    assert await ended(flow_api, quota) == ["sent"] * 8
    assert await fake.admin.max_rate(prefix, 1.0, where={"phase": "quota"}) == 3
    lifted = await patch_flow(flow_api, quotas=None)
    assert lifted["flow_policy"]["quotas"] == {"value": [], "source": "file", "changed_at": None}
    await asyncio.sleep(SETTLE_S)
    free = await send(flow_api, "free", 8)
    assert await ended(flow_api, free) == ["sent"] * 8
    assert await fake.admin.max_rate(prefix, 1.0, where={"phase": "free"}) > 3


async def test_the_breaker_turned_off_and_on_at_run_time(flow_api: FlowApi) -> None:
    http, fake = flow_api.http, flow_api.fake
    await patch_flow(flow_api, breaker=False)
    await asyncio.sleep(SETTLE_S)
    # The endpoint is down. Off: no circuit opens, so each item spends its attempts and fails.
    await fake.admin.set_endpoint_fault(flow_api.webhook, status=500)
    down = await send(flow_api, "off", 4)
    assert await ended(flow_api, down) == ["failed"] * 4
    found = await read_destination(http, flow_api.url)
    assert found["circuit"] == "closed" and found["paused"] is False
    assert found["flow_policy"]["breaker"]["value"] is False
    # On again (the file's value): the next failures open the circuit and items wait.
    back = await patch_flow(flow_api, breaker=None)
    assert back["flow_policy"]["breaker"] == {"value": True, "source": "file", "changed_at": None}
    await asyncio.sleep(SETTLE_S)
    waiting = await send(flow_api, "on", 4)

    async def destination() -> Any:
        return await read_destination(http, flow_api.url)

    opened = await eventually(destination, lambda found: found["circuit"] == "open")
    assert opened["paused"] is True
    # Off while the circuit is open (its probes still failing): it closes at once, and the
    # waiting items spend their attempts.
    await patch_flow(flow_api, breaker=False)
    closed = await eventually(destination, lambda found: found["circuit"] == "closed")
    statuses = await ended(flow_api, waiting)
    await fake.admin.clear_endpoint_fault(flow_api.webhook)
    await patch_flow(flow_api, breaker=None)

    assert closed["paused"] is False
    assert [e["detail"] for e in closed["flow"]["events"] if e["kind"] == "closed"] == [
        "breaker turned off: submits at its configured rate"
    ]
    assert statuses == ["failed"] * 4


BAD_FLOWS = [
    ({"max_in_flight": 0}, "max_in_flight"),
    ({"breaker_failure_ratio": 2}, "breaker_failure_ratio"),
    ({"quotas": [{"per": "soon", "max": 3}]}, "quotas"),
    ({"key_quotas": [{"per": "1s", "max": 3, "burst": 1}]}, "key_quotas"),
    ({"breaker_window_s": "long"}, "breaker_window_s"),
    # Not a run-time field (the throttle's are the file's), and not a field at all.
    ({"throttle_pause": False}, "throttle_pause"),
    ({"max_inflight": 2}, "max_inflight"),
]


@pytest.mark.parametrize("flow_api", ["item"], indirect=True)
async def test_bad_flow_values_are_refused_as_the_files_are(flow_api: FlowApi) -> None:
    for flow, field in BAD_FLOWS:
        response = await flow_api.http.patch(flow_api.url, json={"flow": flow, "submit_rate": 7})
        problem = assert_problem(response, 422)
        assert any(e["location"][:3] == ["body", "flow", field] for e in problem["errors"]), (
            flow,
            problem,
        )
    # Nothing changed: neither the rate given beside them nor any flow field.
    found = (await flow_api.http.get(flow_api.url)).json()
    assert found["submit"]["source"] == "worker"
    assert {entry["source"] for entry in found["flow_policy"].values()} == {"file"}


@pytest.mark.parametrize("flow_api", ["item"], indirect=True)
async def test_an_override_outlives_the_api_until_null_puts_the_files_back(
    flow_api: FlowApi,
) -> None:
    await patch_flow(flow_api, key_max_in_flight=2, breaker_probe_interval_s=3)
    # A new API instance (a restart): the override is the read model's, not the process's.
    settings = api_settings(workflow_task_queue=flow_api.stack.task_queue)
    async for http in open_api(flow_api.stack, settings):
        policy = (await read_destination(http, flow_api.url))["flow_policy"]
        assert policy["key_max_in_flight"]["value"] == 2
        assert policy["key_max_in_flight"]["source"] == "api"
        assert policy["breaker_probe_interval_s"]["value"] == 3
        reverted = await http.patch(flow_api.url, json={"flow": {"key_max_in_flight": None}})
        assert reverted.status_code == 200, reverted.text
    policy = (await flow_api.http.get(flow_api.url)).json()["flow_policy"]
    assert policy["key_max_in_flight"] == {"value": None, "source": "file", "changed_at": None}
    # The field not named stays as it was set.
    assert policy["breaker_probe_interval_s"]["source"] == "api"
