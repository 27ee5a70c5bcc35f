"""Webhooks signed per the Standard Webhooks spec: `webhook-id`, `webhook-timestamp`, signature.

2xx means delivered. 410 means the receiver has disabled the endpoint (the Standard Webhooks
convention): `EndpointGoneError`, on which the submit activity pauses the destination.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Annotated, ClassVar
from urllib.parse import urlsplit, urlunsplit

import httpx
from pydantic import AfterValidator, Field
from standardwebhooks import Webhook

from activities.providers.base import (
    EndpointGoneError,
    HttpProviderSettings,
    HttpUrlText,
    PermanentProviderError,
    check_base64_key,
    probe_url,
    raise_for_status,
    send,
)
from contract.item import PollRequest, PollResult, SubmitRequest, SubmitResult


def check_webhook_secret(secret: str) -> str:
    """`secret` if it is base64 after an optional `whsec_` prefix; raises ValueError otherwise."""
    try:
        check_base64_key(secret.removeprefix("whsec_"))
    except ValueError:
        raise ValueError("must be 'whsec_' + base64") from None
    return secret


class WebhookSettings(HttpProviderSettings):
    """A webhook destination's `settings`: the receiver's URL and the shared signing secret."""

    url: HttpUrlText = Field(
        description="The receiver's http(s) URL; each item's payload is POSTed to it as JSON."
    )
    secret: Annotated[str, AfterValidator(check_webhook_secret)] = Field(
        description="The Standard Webhooks signing secret, base64 with an optional `whsec_`"
        " prefix; every request carries a `webhook-signature` made with it."
    )


class WebhookProvider:
    """POSTs the payload as JSON; the item's idempotency key is the `webhook-id`."""

    kind: ClassVar[str] = "webhook"

    def __init__(self, settings: WebhookSettings, http_client: httpx.AsyncClient) -> None:
        self._url = settings.url
        self._headers = settings.headers
        self._timeout = httpx.Timeout(settings.timeout_s)
        self._client = http_client
        # The Standard Webhooks reference library signs, so receivers using it always verify.
        self._signer = Webhook(settings.secret)

    async def submit(self, request: SubmitRequest) -> SubmitResult:
        body = json.dumps(request.payload, separators=(",", ":"))
        # Whole seconds: the signature covers the timestamp exactly as the header carries it.
        timestamp = int(time.time())
        http_request = self._client.build_request(
            "POST",
            self._url,
            content=body.encode(),
            headers={
                **self._headers,
                "Content-Type": "application/json",
                "webhook-id": request.idempotency_key,
                "webhook-timestamp": str(timestamp),
                "webhook-signature": self._signer.sign(
                    request.idempotency_key, datetime.fromtimestamp(timestamp, UTC), body
                ),
            },
            timeout=self._timeout,
        )
        response = await send(self._client, http_request, "webhook")
        if response.status_code == 410:
            raise EndpointGoneError(
                "webhook: HTTP 410 Gone: the receiver disabled this endpoint",
                endpoint=_without_secrets(self._url),
            )
        raise_for_status(response, "webhook")
        return SubmitResult(delivered=True, provider_message_id=request.idempotency_key)

    async def poll(self, request: PollRequest) -> PollResult:
        raise PermanentProviderError("webhooks are delivered synchronously; nothing to poll")

    async def probe(self) -> str:
        """`HEAD` of the receiver's URL: no message, no signature."""
        return await probe_url(self._client, self._url, self._timeout, "webhook")


def _without_secrets(url: str) -> str:
    """`url` without its query and user info: receivers put tokens there, and this text is
    shown to operators as the reason for a pause."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))
