"""Each provider kind's settings model: what a destination's `settings` must hold.

Pure pydantic, so the API and the service check a destinations file without importing the
providers themselves; `activities/providers/` builds each kind's class from these models.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Annotated
from urllib.parse import urlsplit

from durable_outbox_temporal.contract.limits import DEFAULT_MAX_RETRY_AFTER_S
from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, model_validator


def check_http_url(url: str) -> str:
    """`url` if it is an absolute http(s) URL; raises ValueError otherwise."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError("must be an http:// or https:// URL")
    return url


def check_base64_key(key: str) -> str:
    """`key` if it is non-empty base64; raises ValueError otherwise."""
    try:
        decoded = base64.b64decode(key, validate=True)
    except binascii.Error:
        decoded = b""
    if not decoded:
        raise ValueError("must be base64")
    return key


HttpUrlText = Annotated[str, AfterValidator(check_http_url)]
Base64Key = Annotated[str, AfterValidator(check_base64_key)]

RETRY_AFTER_LIMIT_S = 30 * 24 * 3600.0


class HttpProviderSettings(BaseModel):
    """Settings every HTTP provider takes; a provider's own model adds its fields."""

    # A misspelt setting is an error at load time rather than silently ignored.
    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Timeout of each HTTP request to the provider, in seconds, for each of its"
        " phases (connect, write, read, pool); the destination's `submit_timeout_s` and"
        " `poll_timeout_s` bound the whole activity.",
    )
    headers: dict[str, str] = Field(
        default_factory=dict,
        description="Extra HTTP headers sent with every request to the provider; the headers the"
        " provider sets itself (content type, idempotency key, signature) take precedence.",
    )
    max_retry_after_s: float = Field(
        default=DEFAULT_MAX_RETRY_AFTER_S,
        gt=0,
        le=RETRY_AFTER_LIMIT_S,
        description="The longest `Retry-After` the provider may ask for, in seconds (30 days at"
        " most): one up to it is waited exactly, never undercut; a longer one fails the item"
        " with an error that says so.",
    )


# ACS tracks a repeatable request this long after its `Repeatability-First-Sent`, then answers
# 412 (learn.microsoft.com/rest/api/communication/repeatable-requests).
ACS_REPEATABILITY_WINDOW_S = 300.0


class AcsEmailSettings(HttpProviderSettings):
    """An acs-email destination's `settings`: the resource endpoint and its access key."""

    endpoint: HttpUrlText = Field(
        description="The ACS resource's endpoint, an http(s) URL; sends go to"
        " `{endpoint}/emails:send`."
    )
    access_key: Base64Key = Field(
        description="The resource's access key (base64), with which every request is signed"
        " (HMAC-SHA256)."
    )
    repeatability_window_s: float = Field(
        default=ACS_REPEATABILITY_WINDOW_S,
        gt=0,
        le=24 * 3600,
        description="How long ACS remembers a send by its `Repeatability-Request-Id`, in"
        " seconds (documented: 5 minutes). A retry whose first send is older than this looks"
        " the operation up by its `Operation-Id` before it sends again"
        " (docs/explanation/provider-dedupe.md).",
    )


class AcsSmsSettings(HttpProviderSettings):
    """An acs-sms destination's `settings`: the resource endpoint and its access key."""

    endpoint: HttpUrlText = Field(
        description="The ACS resource's endpoint, an http(s) URL; sends go to `{endpoint}/sms`."
    )
    access_key: Base64Key = Field(
        description="The resource's access key (base64), with which every request is signed"
        " (HMAC-SHA256)."
    )


def check_webhook_secret(secret: str) -> str:
    """`secret` if it is base64 after an optional `whsec_` prefix; raises ValueError otherwise."""
    try:
        check_base64_key(secret.removeprefix("whsec_"))
    except ValueError:
        raise ValueError("must be 'whsec_' + base64") from None
    return secret


WebhookSecret = Annotated[str, AfterValidator(check_webhook_secret)]


class WebhookSettings(HttpProviderSettings):
    """A webhook destination's `settings`: the receiver's URL and the shared signing secret."""

    url: HttpUrlText = Field(
        description="The receiver's http(s) URL; each item's payload is POSTed to it as JSON."
    )
    secret: WebhookSecret = Field(
        description="The Standard Webhooks signing secret, base64 with an optional `whsec_`"
        " prefix; every request carries a `webhook-signature` made with it."
    )
    previous_secret: WebhookSecret | None = Field(
        default=None,
        description="While rotating: the secret `secret` replaces. Until"
        " `previous_secret_until`, every request is signed with both, so receivers verifying"
        " with either accept it.",
    )
    previous_secret_until: AwareDatetime | None = Field(
        default=None,
        description="End of the rotation's grace window, an ISO 8601 time with its offset"
        " (`2026-12-01T12:00:00Z`); from then on only `secret` signs. Required with"
        " `previous_secret`.",
    )

    @model_validator(mode="after")
    def _grace_window_is_complete(self) -> WebhookSettings:
        if (self.previous_secret is None) != (self.previous_secret_until is None):
            raise ValueError("previous_secret and previous_secret_until go together")
        if self.previous_secret is not None and self.previous_secret == self.secret:
            raise ValueError("previous_secret is the same as secret")
        return self


# A provider kind names its settings model here and its class in `activities/providers/`; a test
# checks that the two registries list the same kinds.
PROVIDER_SETTINGS: Mapping[str, type[BaseModel]] = {
    "acs-email": AcsEmailSettings,
    "acs-sms": AcsSmsSettings,
    "webhook": WebhookSettings,
}
