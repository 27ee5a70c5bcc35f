"""Values no JSON body can carry on (a lone surrogate, NaN, Infinity, 1e400) are refused with a
422 naming the field, in every route that takes JSON, never a 500 nor a half-applied batch;
the providers never send them; and a destination's PATCH takes a reason only with `paused` and
flow fields of the right JSON types only."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from durable_outbox_temporal import InvalidRequest
from durable_outbox_temporal.contract.item import SubmitRequest
from durable_outbox_temporal.validation import validate_new_item

from activities.providers.acs_email import AcsEmailProvider
from activities.providers.base import PermanentProviderError
from activities.providers.webhook import WebhookProvider
from configuration.providers import AcsEmailSettings, WebhookSettings
from tests.api.conftest import Api, api_settings, open_api
from tests.api.test_items import assert_problem
from tests.conftest import WEBHOOK_SECRET, unique_name, webhook_destination

ITEMS = "/v1/outboxes/inp/items"
JSON = {"Content-Type": "application/json"}
SURROGATE = "not valid Unicode"
NOT_FINITE = "not a finite number"

# Raw JSON texts (json.dumps cannot write most of them): the value and what the 422 says.
HOSTILE_VALUES = {
    "lone-high-surrogate": ('"\\ud800"', SURROGATE),
    "lone-low-surrogate": ('"x\\udc00y"', SURROGATE),
    "nan": ("NaN", NOT_FINITE),
    "infinity": ("Infinity", NOT_FINITE),
    "minus-infinity": ("-Infinity", NOT_FINITE),
    "overflowing-exponent": ("1e400", NOT_FINITE),
    "overflowing-digits": ("1" * 250 + "e60", NOT_FINITE),
}


def item_text(api: Api, payload: str, **fields: str) -> str:
    """One item's JSON text, its payload written as given."""
    extra = "".join(f', "{name}": "{value}"' for name, value in fields.items())
    return f'{{"destination": "{api.webhook.name}", "payload": {payload}{extra}}}'


def refused(response: httpx.Response, location: list[str], says: str) -> dict[str, Any]:
    """The 422 invalid-request naming `location` and saying `says`."""
    body = assert_problem(response, 422, "invalid-request")
    assert location in [error["location"] for error in body["errors"]], body
    assert says in body["detail"], body
    return body


async def status_of(api: Api, key: str) -> int:
    return (await api.http.get(f"{ITEMS}/{key}")).status_code


@pytest.mark.parametrize("value", HOSTILE_VALUES.values(), ids=HOSTILE_VALUES.keys())
async def test_an_enqueue_with_an_unsendable_value_is_a_422_naming_it(
    api: Api, value: tuple[str, str]
) -> None:
    text, says = value
    body = item_text(api, f'{{"ok": 1, "deep": [{{"v": {text}}}]}}')

    response = await api.http.post(
        ITEMS, content=body, headers={**JSON, "Idempotency-Key": "hostile"}
    )

    refused(response, ["body", "payload", "deep", "0", "v"], says)
    assert await status_of(api, "hostile") == 404


async def test_a_lone_surrogate_in_a_key_or_as_raw_bytes_is_a_422(api: Api) -> None:
    in_a_key = item_text(api, '{"\\udfff": 1}').encode()
    # Python's JSON parser takes a surrogate's UTF-8-like bytes as the surrogate itself.
    raw_bytes = item_text(api, '{"v": "\ud800"}').encode("utf-8", "surrogatepass")

    for body in (in_a_key, raw_bytes):
        response = await api.http.post(ITEMS, content=body, headers=JSON)
        detail = assert_problem(response, 422, "invalid-request")["detail"]
        assert SURROGATE in detail and "payload" in detail


async def test_surrogate_pairs_and_such_words_in_strings_are_enqueued(api: Api) -> None:
    """The check refuses values, not text that looks like them: an emoji written as its pair of
    escapes, "NaN" as a string, a large but finite number."""
    body = item_text(api, '{"smile": "\\ud83d\\ude00", "word": "NaN Infinity", "big": 1e308}')

    response = await api.http.post(ITEMS, content=body, headers={**JSON, "Idempotency-Key": "ok"})
    item = await api.http.get(f"{ITEMS}/ok")

    assert response.status_code == 202, response.text
    assert item.json()["payload"] == {"smile": "😀", "word": "NaN Infinity", "big": 1e308}


async def test_a_batch_refuses_an_unsendable_item_alone_and_enqueues_the_rest(api: Api) -> None:
    """Each item of a batch is validated on its own: the bad ones get their own 422, before
    anything of theirs is handed over, and the good one goes."""
    items = [
        item_text(api, '{"v": "\\ud800"}', idempotency_key="sg-b1"),
        item_text(api, '{"v": 1}', idempotency_key="sg-b2"),
        item_text(api, '{"v": [NaN]}', idempotency_key="sg-b3"),
        item_text(api, '{"\\udc00": 1}', idempotency_key="sg-b4"),
    ]

    response = await api.http.post(
        f"{ITEMS}:batch", content=f'{{"items": [{", ".join(items)}]}}', headers=JSON
    )

    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["created"], body["failed"]) == (1, 3), body
    results = {result["index"]: result for result in body["results"]}
    assert results[1]["status"] == 202
    for index, says in ((0, SURROGATE), (2, NOT_FINITE), (3, SURROGATE)):
        assert results[index]["status"] == 422, results[index]
        problem = results[index]["problem"]
        assert problem["code"] == "invalid-request"
        assert says in problem["detail"]
        assert ["body", "items", str(index), "payload"] in [
            error["location"] for error in problem["errors"]
        ]
    assert [await status_of(api, f"sg-b{n}") for n in (1, 2, 3, 4)] == [404, 200, 404, 404]


async def test_a_batch_item_with_a_surrogate_outside_its_payload_is_refused_alone(
    api: Api,
) -> None:
    """A destination or an unknown field's name: either would otherwise be echoed in the item's
    problem, which no response could encode."""
    items = [
        '{"destination": "\\ud800", "payload": {}, "idempotency_key": "sg-d1"}',
        item_text(api, "{}", idempotency_key="sg-d2", **{"\\udbff": "x"}),
        item_text(api, "{}", idempotency_key="sg-d3"),
    ]

    response = await api.http.post(
        f"{ITEMS}:batch", content=f'{{"items": [{", ".join(items)}]}}', headers=JSON
    )

    assert response.status_code == 200, response.text
    statuses = [result["status"] for result in response.json()["results"]]
    assert statuses == [422, 422, 202]
    assert [await status_of(api, f"sg-d{n}") for n in (1, 2, 3)] == [404, 404, 200]


def schedule_text(api: Api, payload: str) -> str:
    return (
        '{"id": "hostile", "outbox": "inp", "interval_seconds": 3600, "items": ['
        + item_text(api, payload)
        + "]}"
    )


@pytest.mark.parametrize(("text", "says"), [('"\\ud800"', SURROGATE), ("NaN", NOT_FINITE)])
async def test_a_schedule_template_with_an_unsendable_value_is_a_422(
    api: Api, text: str, says: str
) -> None:
    response = await api.http.post(
        "/v1/schedules", content=schedule_text(api, f'{{"v": {text}}}'), headers=JSON
    )

    # Refused before the service (which would answer 501 on the time-skipping server).
    refused(response, ["body", "items", "0", "payload", "v"], says)


@pytest.mark.parametrize(
    ("text", "says"), [('"\\ud800"', SURROGATE), ("Infinity", NOT_FINITE), ("1e400", NOT_FINITE)]
)
async def test_an_aggregate_command_with_an_unsendable_value_is_a_422(
    api: Api, text: str, says: str
) -> None:
    flight = unique_name("hostile")
    base = f"/v1/aggregates/flight/{flight}"

    response = await api.http.post(
        f"{base}/commands/open", content=f'{{"seats": ["1A"], "note": {text}}}', headers=JSON
    )

    refused(response, ["body", "note"], says)
    assert (await api.http.get(base)).status_code == 404


async def test_reasons_and_notes_with_a_lone_surrogate_are_a_422(api: Api) -> None:
    """Free text that is later stored and shown: an item's cancel reason, a purge's, a dead
    letter's discard reason, a schedule's note, a destination's pause reason."""
    delayed = {"destination": api.webhook.name, "payload": {}, "delay_seconds": 3600}
    queued = await api.http.post(ITEMS, json=delayed, headers={"Idempotency-Key": "held"})
    assert queued.status_code == 202, queued.text
    reason = '{"reason": "stop \\ud800"}'
    requests = [
        (f"{ITEMS}/held/cancel", reason, ["body", "reason"]),
        ("/v1/outboxes/inp/items:purge", reason, ["body", "reason"]),
        ("/v1/outboxes/inp/dead-letters/held/discard", reason, ["body", "reason"]),
        ("/v1/schedules/hostile/pause", '{"note": "\\udfff"}', ["body", "note"]),
    ]

    for path, body, location in requests:
        refused(await api.http.post(path, content=body, headers=JSON), location, SURROGATE)
    paused = await api.http.patch(
        f"/v1/destinations/{api.webhook.name}",
        content='{"paused": true, "reason": "\\ud800"}',
        headers=JSON,
    )

    refused(paused, ["body", "reason"], SURROGATE)
    assert (await api.http.get(f"{ITEMS}/held")).json()["status"] == "queued"


async def test_a_debounce_key_with_a_lone_surrogate_is_a_422(api: Api) -> None:
    body = item_text(api, "{}", debounce_key="\\ud800")

    response = await api.http.post(
        ITEMS, content=body[:-1] + ', "debounce_s": 5}', headers={**JSON, "Idempotency-Key": "db"}
    )

    assert_problem(response, 422, "invalid-request")
    assert await status_of(api, "db") == 404


@pytest.mark.parametrize(
    "payload", [{"v": "\ud800"}, {"v": [math.nan]}, {"v": {"w": math.inf}}, {"\udc00": 1}]
)
def test_the_client_refuses_what_the_api_refuses(payload: dict[str, Any]) -> None:
    """OutboxClient and the transactional outbox's rows check the payload the same way."""
    with pytest.raises(InvalidRequest, match="payload"):
        validate_new_item(
            "inp",
            "k",
            ordering_key=None,
            not_before=None,
            max_attempts=None,
            now=None,  # type: ignore[arg-type]
            payload=payload,
        )


def submit_request(payload: dict[str, Any]) -> SubmitRequest:
    return SubmitRequest(
        destination="hook",
        item_id="outbox/inp/nan",
        idempotency_key="nan",
        payload=payload,
        attempt=1,
    )


async def test_the_providers_refuse_to_send_nan_or_infinity() -> None:
    """Their second line of defence: a body with NaN is no JSON, so it never leaves."""
    sent: list[httpx.Request] = []

    def receiver(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(204)

    key = base64.b64encode(b"k" * 32).decode()
    async with httpx.AsyncClient(transport=httpx.MockTransport(receiver)) as http:
        webhook = WebhookProvider(
            WebhookSettings(url="https://receiver.test/hook", secret=WEBHOOK_SECRET), http
        )
        email = AcsEmailProvider(
            AcsEmailSettings(endpoint="https://acs.test", access_key=key), http
        )
        for provider in (webhook, email):
            for value in (math.nan, math.inf, -math.inf):
                with pytest.raises(PermanentProviderError, match="not JSON"):
                    await provider.submit(submit_request({"v": [value]}))
        delivered = await webhook.submit(submit_request({"v": 1.5}))

    assert delivered.delivered is True
    assert [json.loads(request.content) for request in sent] == [{"v": 1.5}]


@pytest_asyncio.fixture(loop_scope="session")
async def dev_http(
    stack_factory: Any, fake_provider: Any, dev_env: Any
) -> AsyncIterator[tuple[Any, str]]:
    webhook = webhook_destination(fake_provider)
    stack = await stack_factory(webhook, env=dev_env)
    async for http in open_api(stack, api_settings(workflow_task_queue=stack.task_queue)):
        yield http, webhook.name


@pytest.mark.parametrize(
    ("patch", "location"),
    [
        ({"reason": "x"}, ["body", "reason"]),
        ({"submit_rate": 5, "reason": "x"}, ["body", "reason"]),
        ({"flow": {"max_in_flight": "3"}}, ["body", "flow", "max_in_flight"]),
        ({"flow": {"breaker_failure_ratio": "0.5"}}, ["body", "flow", "breaker_failure_ratio"]),
        ({"flow": {"breaker": "true"}}, ["body", "flow", "breaker"]),
        ({"flow": {"max_in_flight": 3.0}}, ["body", "flow", "max_in_flight"]),
        (
            {"flow": {"quotas": [{"per": "1h", "max": "5"}]}},
            ["body", "flow", "quotas", "0", "max"],
        ),
    ],
)
async def test_a_destination_patch_refuses_a_lone_reason_and_loose_flow_types(
    dev_http: tuple[httpx.AsyncClient, str], patch: dict[str, Any], location: list[str]
) -> None:
    http, name = dev_http
    url = f"/v1/destinations/{name}"

    response = await http.patch(url, json=patch)
    after = (await http.get(url)).json()

    body = assert_problem(response, 422, "invalid-request")
    assert location in [error["location"] for error in body["errors"]], body
    assert after["paused"] is False and after["submit"]["source"] == "worker"
    assert all(field["source"] == "file" for field in after["flow_policy"].values())


async def test_a_destination_patch_takes_a_reason_with_paused_and_flow_values_typed(
    dev_http: tuple[httpx.AsyncClient, str],
) -> None:
    """The strict patch still takes what it always did (the dev server sets queue rates)."""
    http, name = dev_http
    url = f"/v1/destinations/{name}"

    flow = await http.patch(
        url, json={"flow": {"max_in_flight": 3, "quotas": [{"per": 60, "max": 5}]}}
    )
    paused = await http.patch(url, json={"paused": True, "reason": "maintenance"})
    resumed = await http.patch(url, json={"paused": False, "reason": "done"})

    assert flow.status_code == 200, flow.text
    policy = flow.json()["flow_policy"]
    assert policy["max_in_flight"]["value"] == 3
    assert policy["quotas"]["value"] == [{"per": 60.0, "max": 5}]
    assert paused.status_code == 200, paused.text
    assert paused.json()["pause_reason"] == "maintenance"
    assert resumed.status_code == 200 and resumed.json()["paused"] is False
