"""Bad input gets a 4xx problem, never a 500: cases found by schemathesis and by issue 31's
attack on a running stack (`test_schemathesis.py` generates more)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pytest
from durable_outbox_temporal import InvalidRequest, validate_key, validate_ordering_key
from durable_outbox_temporal.codec import ENCODING, KEY_ID, new_key_setting
from durable_outbox_temporal.contract.schedule import ItemTemplate
from durable_outbox_temporal.validation import MAX_JSON_DEPTH

from api.errors import json_nesting_exceeds
from service.schedules import InvalidSchedule, NewSchedule, ScheduleService
from tests.api.conftest import Api
from tests.api.test_items import assert_problem


@pytest.mark.parametrize("field", ["ordering_key", "idempotency_key"])
async def test_lone_surrogates_are_422_not_500(api: Api, field: str) -> None:
    """Found by schemathesis: JSON may escape a lone surrogate that no UTF-8 id can carry."""
    item = f'{{"destination": "{api.webhook.name}", "payload": {{}}, "{field}": "\\ud800"}}'
    body = item if field == "ordering_key" else f'{{"items": [{item}]}}'
    path = "/v1/outboxes/tests/items" + ("" if field == "ordering_key" else ":batch")

    response = await api.http.post(path, content=body, headers={"Content-Type": "application/json"})

    if field == "ordering_key":
        assert_problem(response, 422, "invalid-request")
    else:
        assert response.status_code == 200
        assert response.json()["results"][0]["status"] == 422


@pytest.mark.parametrize("key", [".", "..", "a/b", "", "x" * 1001, "tab\there"])
def test_the_client_refuses_keys_the_api_refuses(key: str) -> None:
    """Callers of OutboxClient (the CLI, other services) get the same rules as the API's."""
    with pytest.raises(InvalidRequest):
        validate_key(key)


async def test_an_ordering_key_cannot_be_combined_with_a_delay(api: Api) -> None:
    """A delayed item would hold up every item behind it in its lane."""
    response = await api.http.post(
        "/v1/outboxes/tests/items",
        json={
            "destination": api.webhook.name,
            "payload": {},
            "ordering_key": "customer-7",
            "delay_seconds": 60,
        },
        headers={"Idempotency-Key": "ordered"},
    )

    assert "cannot be combined with ordering_key" in assert_problem(response, 422)["detail"]
    assert_problem(await api.http.get("/v1/outboxes/tests/items/ordered"), 404)


@pytest.mark.parametrize("key", [".", ".."])
def test_dots_are_refused_as_keys_of_either_kind(key: str) -> None:
    """Both kinds of key are the last segment of a URL (an item's, a lane's)."""
    with pytest.raises(InvalidRequest):
        validate_ordering_key(key)
    with pytest.raises(InvalidRequest):
        validate_key(key)


# Issue 31, point 4: inputs that answered 500. Each case is a request and the 4xx it must get.
BEFORE_YEAR_1 = "0001-01-01T00:00:00+14:00"  # 0000-12-31T10:00Z in UTC
AFTER_YEAR_9999 = "9999-12-31T23:59:59-14:00"  # 10000-01-01T13:59:59Z in UTC
TOO_DEEP = 600  # levels of nesting: past the limit, and deep enough to break a recursive walk


def _cursor(*fields: Any) -> str:
    raw = json.dumps(list(fields)).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _nested(depth: int) -> dict[str, Any]:
    document: dict[str, Any] = {"leaf": True}
    for _ in range(depth - 1):
        document = {"a": document}
    return document


def _enqueue_body(api: Api, **fields: Any) -> dict[str, Any]:
    return {"destination": api.webhook.name, "payload": {}, **fields}


def _codec_body(key_id: bytes, data: bytes) -> dict[str, Any]:
    metadata = {"encoding": base64.b64encode(ENCODING).decode(), KEY_ID: _b64(key_id)}
    return {"payloads": [{"metadata": metadata, "data": _b64(data)}]}


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _schedule_body(api: Api, payload: dict[str, Any]) -> dict[str, Any]:
    item = {"destination": api.webhook.name, "payload": payload}
    return {"id": "deep", "outbox": "tests", "interval_seconds": 3600, "items": [item]}


@dataclass
class BadRequest:
    """A request (built for the test's Api) and the answer it must get."""

    method: str
    path: str
    status: int
    problem: str | None = None
    body: Callable[[Api], Any] | None = None
    raw: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    # Encrypted payloads (`PAYLOAD_KEYS`) for the codec routes.
    payload_keys: bool = False


DEAD_LETTERS = "/v1/outboxes/tests/dead-letters"
ITEMS = "/v1/outboxes/tests/items"
EVENTS_SECRET = "bad-input-events-secret"
PAYLOAD_KEYS = new_key_setting("k1")
EVENT_GRID_REPORT = {
    "id": "e1",
    "eventType": "Microsoft.Communication.EmailDeliveryReportReceived",
    "subject": "s",
    "dataVersion": "1.0",
    "data": {},
}

CLOUD_EVENT_REPORT = {
    "specversion": "1.0",
    "id": "c1",
    "source": "/acs",
    "type": EVENT_GRID_REPORT["eventType"],
    "data": {},
}

BAD_REQUESTS = {
    # Dates that leave years 1-9999 once converted to UTC.
    "items-created-from-before-year-1": BadRequest(
        "GET", f"{ITEMS}?created_from={quote(BEFORE_YEAR_1)}", 422, "invalid-request"
    ),
    "items-created-to-after-year-9999": BadRequest(
        "GET", f"{ITEMS}?created_to={quote(AFTER_YEAR_9999)}", 422, "invalid-request"
    ),
    "dead-letters-failed-from-before-year-1": BadRequest(
        "GET", f"{DEAD_LETTERS}?failed_from={quote(BEFORE_YEAR_1)}", 422, "invalid-request"
    ),
    "dead-letters-failed-to-after-year-9999": BadRequest(
        "GET", f"{DEAD_LETTERS}?failed_to={quote(AFTER_YEAR_9999)}", 422, "invalid-request"
    ),
    "redrive-failed-from-before-year-1": BadRequest(
        "POST",
        "/v1/outboxes/tests/dead-letters:redrive",
        422,
        "invalid-request",
        body=lambda api: {"failed_from": BEFORE_YEAR_1},
    ),
    "redrive-failed-to-after-year-9999": BadRequest(
        "POST",
        "/v1/outboxes/tests/dead-letters:redrive",
        422,
        "invalid-request",
        body=lambda api: {"failed_to": AFTER_YEAR_9999},
    ),
    "enqueue-not-before-before-year-1": BadRequest(
        "POST", ITEMS, 422, body=lambda api: _enqueue_body(api, not_before=BEFORE_YEAR_1)
    ),
    "enqueue-not-before-after-year-9999": BadRequest(
        "POST", ITEMS, 422, body=lambda api: _enqueue_body(api, not_before=AFTER_YEAR_9999)
    ),
    # Cursors: what the API hands out is opaque; anything else is the caller's mistake.
    "items-cursor-before-year-1": BadRequest(
        "GET", f"{ITEMS}?cursor={_cursor(BEFORE_YEAR_1, 'x')}", 422, "invalid-cursor"
    ),
    "items-cursor-after-year-9999": BadRequest(
        "GET", f"{ITEMS}?cursor={_cursor(AFTER_YEAR_9999, 'x')}", 422, "invalid-cursor"
    ),
    "items-cursor-not-base64": BadRequest("GET", f"{ITEMS}?cursor=%FF%FE", 422, "invalid-cursor"),
    "items-cursor-wrong-shape": BadRequest(
        "GET", f"{ITEMS}?cursor={_cursor(1, 2, 3)}", 422, "invalid-cursor"
    ),
    "dead-letters-cursor-before-year-1": BadRequest(
        "GET", f"{DEAD_LETTERS}?cursor={_cursor(BEFORE_YEAR_1, 'x')}", 422, "invalid-cursor"
    ),
    "dead-letters-cursor-not-a-date": BadRequest(
        "GET", f"{DEAD_LETTERS}?cursor={_cursor('yesterday', 'x')}", 422, "invalid-cursor"
    ),
    # JSON nested past the limit, in a payload, a batch item, a template, a command, a raw body.
    "enqueue-deep-payload": BadRequest(
        "POST",
        ITEMS,
        422,
        "too-deeply-nested",
        body=lambda api: _enqueue_body(api, payload=_nested(TOO_DEEP)),
    ),
    "batch-deep-payload": BadRequest(
        "POST",
        f"{ITEMS}:batch",
        422,
        "too-deeply-nested",
        body=lambda api: {"items": [_enqueue_body(api, payload=_nested(TOO_DEEP))]},
    ),
    "schedule-deep-template": BadRequest(
        "POST",
        "/v1/schedules",
        422,
        "too-deeply-nested",
        body=lambda api: _schedule_body(api, _nested(TOO_DEEP)),
    ),
    "command-deep-payload": BadRequest(
        "POST",
        "/v1/aggregates/flight/BA1/commands/open",
        422,
        "too-deeply-nested",
        body=lambda api: {"seats": ["1A"], "extra": _nested(TOO_DEEP)},
    ),
    "enqueue-100000-brackets": BadRequest(
        "POST", ITEMS, 422, "too-deeply-nested", raw=b"[" * 100_000
    ),
    "enqueue-100000-brackets-in-a-string-is-just-a-string": BadRequest(
        "POST",
        ITEMS,
        422,
        "invalid-request",
        raw=json.dumps({"destination": "x" * 300, "payload": {"s": "[" * 100_000}}).encode(),
    ),
    # The Event Grid endpoint reads its body itself.
    "events-100000-brackets": BadRequest(
        "POST",
        f"/v1/destinations/{{email}}/events?secret={EVENTS_SECRET}",
        422,
        "too-deeply-nested",
        raw=b"[" * 100_000,
    ),
    "events-100000-brackets-not-said-json": BadRequest(
        "POST",
        f"/v1/destinations/{{email}}/events?secret={EVENTS_SECRET}",
        422,
        "too-deeply-nested",
        raw=b"[" * 100_000,
        headers={"Content-Type": "text/plain"},
    ),
    "events-integer-event-time": BadRequest(
        "POST",
        f"/v1/destinations/{{email}}/events?secret={EVENTS_SECRET}",
        400,
        "not-an-event-grid-delivery",
        body=lambda api: [{**EVENT_GRID_REPORT, "eventTime": 1700000000}],
    ),
    # Others' fixes of issue 31, as far as they are a request and its answer.
    "codec-key-id-not-utf-8": BadRequest(
        "POST",
        "/codec/decode",
        422,
        "undecodable-payload",
        body=lambda api: _codec_body(b"\xff\xfe", b"x" * 40),
        payload_keys=True,
    ),
    "codec-empty-ciphertext": BadRequest(
        "POST",
        "/codec/decode",
        422,
        "undecodable-payload",
        body=lambda api: _codec_body(b"k1", b""),
        payload_keys=True,
    ),
    "destination-rate-that-never-delivers": BadRequest(
        "PATCH", "/v1/destinations/{webhook}", 422, body=lambda api: {"submit_rate": 9.7e-39}
    ),
    "events-cloud-event-time-not-a-date": BadRequest(
        "POST",
        f"/v1/destinations/{{email}}/events?secret={EVENTS_SECRET}",
        400,
        "not-an-event-grid-delivery",
        body=lambda api: {**CLOUD_EVENT_REPORT, "time": "x"},
    ),
    "aggregate-events-after-past-64-bits": BadRequest(
        "GET", "/v1/aggregates/flight/BA1/events?after=9223372036854775808", 422
    ),
}


@pytest.mark.parametrize("case", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
async def test_bad_input_is_a_4xx_problem(api_factory, monkeypatch, case: BadRequest) -> None:
    """Issue 31's inputs that answered 500 (or 202 and then looped): each is refused with a 4xx
    problem+json naming the mistake."""
    if case.payload_keys:
        monkeypatch.setenv("PAYLOAD_KEYS", PAYLOAD_KEYS)
    api = await api_factory(email_overrides={"events_secret": EVENTS_SECRET})
    headers = {"Content-Type": "application/json", **case.headers}
    content = case.raw if case.body is None else json.dumps(case.body(api)).encode()
    path = case.path.replace("{email}", api.email.name).replace("{webhook}", api.webhook.name)

    response = await api.http.request(case.method, path, content=content, headers=headers)

    assert_problem(response, case.status, case.problem)


async def test_a_payload_nested_within_the_limit_is_enqueued(api: Api) -> None:
    """The limit leaves room: the request body's own levels plus a payload of 60."""
    response = await api.http.post(ITEMS, json=_enqueue_body(api, payload=_nested(60)))

    assert response.status_code == 202, response.text


def test_a_schedule_template_nested_too_deeply_is_refused_by_the_service(api: Api) -> None:
    """The CLI and other callers reach the service without the API's body check."""
    template = ItemTemplate(destination=api.webhook.name, payload=_nested(TOO_DEEP))
    new = NewSchedule(id="deep", outbox="tests", items=[template], interval_seconds=60)

    with pytest.raises(InvalidSchedule) as refused:
        ScheduleService(api.stack.outbox, "operations").validate(new)

    assert [location for location, _ in refused.value.errors] == ["items.0.payload"]


@pytest.mark.parametrize(
    ("body", "too_deep"),
    [
        (b"[" * (MAX_JSON_DEPTH + 1), True),
        (b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH, False),
        (b"[]" * 10_000, False),  # many brackets, none nested
        (json.dumps({"text": "[" * 10_000}).encode(), False),  # in a string
        (json.dumps({"text": '\\"' + "{" * 10_000}).encode(), False),  # after an escaped quote
        (json.dumps([{"text": "]"}] * 100).encode(), False),
        (json.dumps(_nested(MAX_JSON_DEPTH + 1)).encode(), True),
    ],
)
def test_the_body_check_counts_nesting_outside_strings(body: bytes, too_deep: bool) -> None:
    assert json_nesting_exceeds(body, MAX_JSON_DEPTH) is too_deep


async def test_a_report_dated_outside_years_1_to_9999_in_utc_is_invalid(api_factory) -> None:
    """Read as it was, such a date reached the item's workflow and then the read model."""
    api = await api_factory(email_overrides={"events_secret": EVENTS_SECRET})
    data = {
        "messageId": "m1",
        "recipient": "ada@example.com",
        "status": "Delivered",
        "deliveryAttemptTimestamp": AFTER_YEAR_9999,
    }

    response = await api.http.post(
        f"/v1/destinations/{api.email.name}/events?secret={EVENTS_SECRET}",
        json=[{**EVENT_GRID_REPORT, "eventTime": "2026-01-01T00:00:00Z", "data": data}],
    )

    assert response.status_code == 200, response.text
    assert response.json()["invalid"] == 1
