"""Webhooks signed per the Standard Webhooks spec: `webhook-id`, `webhook-timestamp`, signature.

2xx means delivered. 410 means the receiver has disabled the endpoint (the Standard Webhooks
convention): `EndpointGoneError`, on which the submit activity pauses the destination.

Rotating the signing secret: until `previous_secret_until`, each message carries a signature
made with `secret` and one made with `previous_secret` (the spec's space-separated list), so a
receiver that still verifies with the old secret and one that already has the new one both
accept; the procedure is in docs/how-to/configure.md.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import ClassVar
from urllib.parse import urlsplit, urlunsplit

import httpx
from durable_outbox_temporal.contract.debounce_rules import delivered_body
from durable_outbox_temporal.contract.item import (
    PollRequest,
    PollResult,
    SubmitRequest,
    SubmitResult,
)
from standardwebhooks import Webhook

from activities.providers.base import (
    EndpointGoneError,
    PermanentProviderError,
    probe_url,
    raise_for_status,
    send,
)
from configuration.providers import WebhookSettings


class WebhookProvider:
    """POSTs the payload as JSON; the item's idempotency key is the `webhook-id`."""

    kind: ClassVar[str] = "webhook"

    def __init__(self, settings: WebhookSettings, http_client: httpx.AsyncClient) -> None:
        self._url = settings.url
        self._headers = settings.headers
        self._timeout = httpx.Timeout(settings.timeout_s)
        self._client = http_client
        self._max_retry_after_s = settings.max_retry_after_s
        # The Standard Webhooks reference library signs, so receivers using it always verify.
        self._signer = Webhook(settings.secret)
        self._previous_signer = (
            Webhook(settings.previous_secret) if settings.previous_secret is not None else None
        )
        self._previous_until = settings.previous_secret_until

    async def submit(self, request: SubmitRequest) -> SubmitResult:
        # A debounce window's collected payloads go as the JSON array itself.
        try:
            body = json.dumps(
                delivered_body(request.payload), separators=(",", ":"), allow_nan=False
            )
        except ValueError as err:
            # NaN or Infinity: no receiver's JSON parser takes them, and no retry changes that.
            raise PermanentProviderError(f"webhook: the payload is not JSON: {err}") from None
        # Whole seconds: the signature covers the timestamp exactly as the header carries it.
        timestamp = int(time.time())
        signed_at = datetime.fromtimestamp(timestamp, UTC)
        http_request = self._client.build_request(
            "POST",
            self._url,
            content=body.encode(),
            headers={
                **self._headers,
                "Content-Type": "application/json",
                "webhook-id": request.idempotency_key,
                "webhook-timestamp": str(timestamp),
                "webhook-signature": self._signatures(request.idempotency_key, signed_at, body),
            },
            timeout=self._timeout,
        )
        response = await send(self._client, http_request, "webhook")
        if response.status_code == 410:
            raise EndpointGoneError(
                "webhook: HTTP 410 Gone: the receiver disabled this endpoint",
                endpoint=_without_secrets(self._url),
            )
        raise_for_status(response, "webhook", self._max_retry_after_s)
        return SubmitResult(delivered=True, provider_message_id=request.idempotency_key)

    def _signatures(self, message_id: str, signed_at: datetime, body: str) -> str:
        """The `webhook-signature` header: the current secret's signature, then, within the
        rotation's grace window, the previous secret's."""
        signatures = [self._signer.sign(message_id, signed_at, body)]
        if (
            self._previous_signer is not None
            and self._previous_until is not None
            and signed_at < self._previous_until
        ):
            signatures.append(self._previous_signer.sign(message_id, signed_at, body))
        return " ".join(signatures)

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
