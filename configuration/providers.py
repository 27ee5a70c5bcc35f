"""Each provider kind's settings model: what a destination's `settings` must hold.

Pure pydantic, so the API and the service check a destinations file without importing the
providers themselves; `activities/providers/` builds each kind's class from these models.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Annotated, Literal
from urllib.parse import urlsplit

from durable_outbox_temporal.contract.http_call import DEFAULT_MAX_BODY_BYTES, placeholders
from durable_outbox_temporal.contract.limits import DEFAULT_MAX_RETRY_AFTER_S
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    model_validator,
)


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
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

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


def check_url_template(template: str) -> str:
    """`template` if its placeholders are known and it is an http(s) URL once they are filled;
    raises ValueError otherwise."""
    placeholders(template)
    try:
        check_http_url(template.replace("{", "").replace("}", ""))
    except ValueError:
        raise ValueError("must be an http:// or https:// URL (placeholders allowed)") from None
    if urlsplit(template).netloc != urlsplit(template.replace("{", "").replace("}", "")).netloc:
        raise ValueError("may not have a placeholder in its host")
    return template


UrlTemplate = Annotated[str, AfterValidator(check_url_template)]


def _scheme_and_host(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme.lower(), parts.netloc.lower()


# Stripe keeps an idempotency key at least 24 hours (docs.stripe.com/api/idempotent_requests).
HTTP_IDEMPOTENCY_WINDOW_S = 24 * 3600.0


class HttpCallSettings(HttpProviderSettings):
    """An http destination's `settings`: a payment or other JSON API and its credentials."""

    method: Literal["POST", "PUT", "PATCH", "DELETE"] = Field(
        default="POST", description="The HTTP method of each call."
    )
    url: UrlTemplate = Field(
        description="Where each item is sent, an http(s) URL template: `{idempotency_key}` is"
        " the item's provider key, `{payload.<field>}` a top-level field of its payload"
        " (an item without it is refused at enqueue)."
    )
    status_url: UrlTemplate | None = Field(
        default=None,
        description="The reconcile step's lookup, a URL template as `url`'s and on its origin:"
        " `GET` it answers"
        " 2xx if the call was made, 404 if not. Past `idempotency_window_s` a retry looks the"
        " call up first and sends only if it is not found; without it such a retry is sent"
        " again (at-least-once, docs/explanation/provider-dedupe.md).",
    )
    idempotency_window_s: float = Field(
        default=HTTP_IDEMPOTENCY_WINDOW_S,
        gt=0,
        le=30 * 24 * 3600,
        description="How long the API remembers an `Idempotency-Key`, in seconds (Stripe: 24"
        " hours). A retry whose first call is older than this uses `status_url` first.",
    )
    poll_operations: bool = Field(
        default=False,
        description="Whether a 202 with `Operation-Location` or `Location` is a long-running"
        " operation to poll (`GET` it, honouring `Retry-After`) rather than a finished call.",
    )
    max_body_bytes: int = Field(
        default=DEFAULT_MAX_BODY_BYTES,
        gt=0,
        le=16 * 1024 * 1024,
        description="The largest body, in bytes of compact JSON; a larger payload is refused"
        " at enqueue with 413.",
    )
    auth: Literal["none", "bearer", "basic", "header"] = Field(
        default="none",
        description="How each request authenticates: `bearer` sends `Authorization: Bearer"
        " {token}`, `basic` HTTP Basic with `username` and `password`, `header` the header"
        " `auth_header` with `token` as its value.",
    )
    token: SecretStr | None = Field(
        default=None,
        description="The bearer token or the `header` auth's value; never logged. Take it from"
        " the environment (`${PAY_API_TOKEN}`).",
    )
    username: str | None = Field(default=None, description="The `basic` auth's user name.")
    password: SecretStr | None = Field(
        default=None, description="The `basic` auth's password; never logged."
    )
    auth_header: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9-]+$",
        description="The `header` auth's header name (`X-Api-Key`).",
    )

    @model_validator(mode="after")
    def _lookup_is_on_the_same_origin(self) -> HttpCallSettings:
        # The lookup carries the credentials, which go to the call's origin only.
        if self.status_url is not None and _scheme_and_host(self.status_url) != _scheme_and_host(
            self.url
        ):
            raise ValueError("status_url: must be on url's scheme, host and port")
        return self

    @model_validator(mode="after")
    def _credentials_are_complete(self) -> HttpCallSettings:
        needed = {
            "none": (),
            "bearer": ("token",),
            "basic": ("username", "password"),
            "header": ("auth_header", "token"),
        }[self.auth]
        missing = [name for name in needed if not getattr(self, name)]
        if missing:
            raise ValueError(f"{', '.join(missing)}: required with auth = {self.auth!r}")
        # A credential the scheme would not send is a mistake in the file, not to be ignored.
        unused = [
            name
            for name in ("token", "username", "password", "auth_header")
            if name not in needed and getattr(self, name) is not None
        ]
        if unused:
            raise ValueError(f"{', '.join(unused)}: not used with auth = {self.auth!r}")
        return self


# A provider kind names its settings model here and its class in `activities/providers/`; a test
# checks that the two registries list the same kinds.
PROVIDER_SETTINGS: Mapping[str, type[BaseModel]] = {
    "acs-email": AcsEmailSettings,
    "acs-sms": AcsSmsSettings,
    "webhook": WebhookSettings,
    "http": HttpCallSettings,
}
