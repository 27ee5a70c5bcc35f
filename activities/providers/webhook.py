"""Webhooks signed per the Standard Webhooks spec: `webhook-id`, `webhook-timestamp`, signature.

2xx means delivered; 410 means the receiver has disabled the endpoint, so it is permanent.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any, ClassVar

import httpx

from activities.providers.base import PermanentProviderError, raise_for_status, send
from common.models import PollRequest, PollResult, SubmitRequest, SubmitResult


def webhook_signature(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """`v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">` with the `whsec_` secret."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{message_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


class WebhookProvider:
    """POSTs the payload as JSON; the item's idempotency key is the `webhook-id`."""

    kind: ClassVar[str] = "webhook"

    def __init__(self, settings: Mapping[str, Any], http_client: httpx.AsyncClient) -> None:
        missing = [name for name in ("url", "secret") if not settings.get(name)]
        if missing:
            raise ValueError(f"webhook settings need {', '.join(missing)}")
        try:
            base64.b64decode(str(settings["secret"]).removeprefix("whsec_"), validate=True)
        except ValueError as err:
            raise ValueError("webhook secret must be 'whsec_' + base64") from err
        self._url = str(settings["url"])
        self._secret = str(settings["secret"])
        self._headers = {str(k): str(v) for k, v in dict(settings.get("headers", {})).items()}
        self._timeout = httpx.Timeout(float(settings.get("timeout_s", 10.0)))
        self._client = http_client

    async def submit(self, request: SubmitRequest) -> SubmitResult:
        body = json.dumps(request.payload, separators=(",", ":")).encode()
        timestamp = int(time.time())
        http_request = self._client.build_request(
            "POST",
            self._url,
            content=body,
            headers={
                **self._headers,
                "Content-Type": "application/json",
                "webhook-id": request.idempotency_key,
                "webhook-timestamp": str(timestamp),
                "webhook-signature": webhook_signature(
                    self._secret, request.idempotency_key, timestamp, body
                ),
            },
            timeout=self._timeout,
        )
        response = await send(self._client, http_request, "webhook")
        if response.status_code == 410:
            raise PermanentProviderError(
                "webhook: HTTP 410 Gone: the receiver disabled this endpoint", status_code=410
            )
        raise_for_status(response, "webhook")
        return SubmitResult(delivered=True, provider_message_id=request.idempotency_key)

    async def poll(self, request: PollRequest) -> PollResult:
        raise PermanentProviderError("webhooks are delivered synchronously; nothing to poll")
