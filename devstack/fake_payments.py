"""The fake provider's payment API: `POST /payments` with an `Idempotency-Key`, as Stripe's.

Mounted on the fake provider (`devstack/fake_provider.py`), whose fault steps, counters and
delivery log it shares; a request's key there is its `Idempotency-Key` (a Structured Field string
as the IETF draft writes it, or a bare token as Stripe takes it). Requests need `Authorization:
Bearer <token>` (`FAKE_PAYMENT_TOKEN`, default the fake provider's `DEFAULT_PAYMENT_TOKEN`).

It behaves as a payment API does (`devstack/fake_memory.py`, `IdempotencyKeys`): a key is
remembered with its first answer for `payment_key_window_s` (24 hours unless the fault config
says otherwise), and a repeat inside it gets that answer again, header `Idempotent-Replayed:
true`, without a second payment; a repeat with another body is refused with Stripe's 400
`idempotency_error`; after the window the key is forgotten and a repeat is a new payment. A
`payment_method` of `pm_card_chargeDeclined` (Stripe's test card) is declined with 402
`card_declined`, an answer remembered like any other. A payment, unlike its key, is kept:
`GET /payments/by-key/{key}` finds it whenever it was made (the `status_url` of the reconcile
step), 404 if there is none. A scripted step with `running_polls` answers 202 with an
`Operation-Location` to poll; `drop_response` takes the payment and drops the answer.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from devstack import fake_provider
from devstack.fake_memory import IdempotencyKeys

log = logging.getLogger("fake_provider.payments")

# Stripe's test payment method whose charges are declined.
DECLINED_METHOD = "pm_card_chargeDeclined"
# The delivery log's endpoint for payments.
ENDPOINT = "payments"


@dataclass
class PaymentOperation:
    """A payment still processing: answered `processing` for `polls_left` more polls."""

    polls_left: int
    result: str


@dataclass
class PaymentMemory:
    """What the fake payment API remembers: keys within their window, payments for ever."""

    keys: IdempotencyKeys = field(default_factory=IdempotencyKeys)
    by_key: dict[str, dict[str, Any]] = field(default_factory=dict)
    operations: dict[str, PaymentOperation] = field(default_factory=dict)


def routes(state: fake_provider.FakeProviderState) -> list[BaseRoute]:
    """The payment routes over the fake provider's `state`."""

    def authorised(request: Request) -> bool:
        return request.headers.get("authorization") == f"Bearer {state.payment_token}"

    async def pay(request: Request) -> Response:
        body = await request.body()
        key = _idempotency_key(request.headers.get("idempotency-key"))
        stats = state.record(key, request.url.path, "submit")
        if not authorised(request):
            return _error(401, "invalid_request_error", "Invalid API Key provided.")
        if key is None:
            return _error(400, "invalid_request_error", "An Idempotency-Key header is required.")
        payment = _json(body)
        if payment is None:
            return _error(400, "invalid_request_error", "The body must be a JSON object.")
        now = time.time()
        first, same_body = state.payments.keys.recall(key, body, now)
        if first is not None and not same_body:
            log.info("payment %s -> 400 (key reused with another body)", key)
            return _error(
                400,
                "idempotency_error",
                "Keys for idempotent requests can only be used with the same parameters they"
                f" were first used with. Try using a key other than '{key}' if you meant to"
                " execute a different request.",
            )
        if first is not None:
            log.info("payment %s -> %s (replayed)", key, first.status)
            return Response(
                first.body,
                first.status,
                headers={**first.headers, "Idempotent-Replayed": "true"},
                media_type="application/json",
            )
        step = state.next_step(key, request, ENDPOINT)
        fault = await fake_provider._apply_fault(state, step, stats)
        if fault is not None:
            log.info("payment %s -> %s (injected)", key, fault.status_code)
            return fault
        answer = _execute(state, key, payment, step, request, body)
        state.payments.keys.remember(
            key,
            body,
            (answer.status_code, bytes(answer.body), _own_headers(answer)),
            now,
            state.faults.payment_key_window_s,
        )
        if step.drop_response:
            log.info("payment %s -> %s, connection dropped (injected)", key, answer.status_code)
            return fake_provider.LostResponse(answer)
        log.info("payment %s -> %s", key, answer.status_code)
        return answer

    async def by_key(request: Request) -> Response:
        state.record(None, request.url.path, "lookup")
        if not authorised(request):
            return _error(401, "invalid_request_error", "Invalid API Key provided.")
        found = state.payments.by_key.get(request.path_params["key"])
        if found is None:
            return _error(404, "invalid_request_error", "No such payment.")
        return JSONResponse(found)

    async def operation(request: Request) -> Response:
        payment_id = request.path_params["payment_id"]
        found = next((p for p in state.payments.by_key.values() if p["id"] == payment_id), None)
        state.record(found["idempotency_key"] if found else None, request.url.path, "poll")
        if not authorised(request):
            return _error(401, "invalid_request_error", "Invalid API Key provided.")
        pending = state.payments.operations.get(payment_id)
        if found is None or pending is None:
            return _error(404, "invalid_request_error", "No such operation.")
        if pending.polls_left > 0:
            pending.polls_left -= 1
            return JSONResponse(
                {"id": payment_id, "status": "processing"}, 202, {"Retry-After": "1"}
            )
        found["status"] = pending.result
        answer: dict[str, Any] = {"id": payment_id, "status": pending.result}
        if pending.result != "succeeded":
            answer["error"] = {"code": "processing_error", "message": "injected payment failure"}
        return JSONResponse(answer)

    return [
        Route("/payments", pay, methods=["POST"]),
        Route("/payments/by-key/{key}", by_key, methods=["GET"]),
        Route("/payments/{payment_id}/operation", operation, methods=["GET"]),
    ]


def _execute(
    state: fake_provider.FakeProviderState,
    key: str,
    payment: dict[str, Any],
    step: fake_provider.Step,
    request: Request,
    body: bytes,
) -> JSONResponse:
    """Make the payment (or decline it) and say how it went."""
    if payment.get("payment_method") == DECLINED_METHOD:
        log.info("payment %s declined", key)
        return JSONResponse(
            {
                "error": {
                    "type": "card_error",
                    "code": "card_declined",
                    "decline_code": "generic_decline",
                    "message": "Your card was declined.",
                }
            },
            402,
        )
    payment_id = f"pay_{uuid.uuid4().hex[:24]}"
    record = {
        **payment,
        "id": payment_id,
        "object": "payment",
        "status": "succeeded",
        "idempotency_key": key,
    }
    state.payments.by_key[key] = record
    state.log_delivery(key, ENDPOINT, request, body)
    if step.running_polls is None:
        return JSONResponse(record)
    record["status"] = "processing"
    state.payments.operations[payment_id] = PaymentOperation(
        step.running_polls, "failed" if step.operation_result == "Failed" else "succeeded"
    )
    base = str(request.base_url).rstrip("/")
    return JSONResponse(
        record,
        202,
        {"Operation-Location": f"{base}/payments/{payment_id}/operation", "Retry-After": "1"},
    )


def _idempotency_key(value: str | None) -> str | None:
    """The key of an `Idempotency-Key` header: a Structured Field string, or a bare token."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return value


def _own_headers(answer: Response) -> dict[str, str]:
    return {
        name: value
        for name, value in answer.headers.items()
        if name.lower() not in ("content-length", "content-type")
    }


def _error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"type": kind, "message": message}}, status)


def _json(body: bytes) -> dict[str, Any] | None:
    try:
        document = json.loads(body)
    except ValueError:
        return None
    return document if isinstance(document, dict) else None
