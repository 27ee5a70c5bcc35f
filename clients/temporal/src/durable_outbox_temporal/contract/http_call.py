"""An `http` item (a payment call or another JSON API): its URL template and body, checked where
the item is enqueued and rendered where it is sent.

A destination's `url` and `status_url` are templates: `{idempotency_key}` is the item's provider
key (the `Idempotency-Key` header's value), `{payload.NAME}` a top-level field of the item's
payload, a string or an integer, percent-encoded into the URL. The body is the payload as
compact JSON; over the destination's `max_body_bytes` it is refused at enqueue (413), and a
payload without a field its URL names is refused there too (422), rather than failing every
attempt.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

# The provider kind whose destinations' payloads are checked here.
HTTP_CALL = "http"
# A payment body is small; a request this large is more likely a mistake than a payment.
DEFAULT_MAX_BODY_BYTES = 64 * 1024
IDEMPOTENCY_KEY = "idempotency_key"
_PAYLOAD_FIELD = re.compile(r"payload\.([A-Za-z_][A-Za-z0-9_]*)")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


class BodyTooLarge(ValueError):
    """The body is over the destination's `max_body_bytes`."""


def placeholders(template: str) -> list[str]:
    """The placeholders `template` names, in order; ValueError for an unknown one or a stray
    brace."""
    names = _PLACEHOLDER.findall(template)
    if "{" in _PLACEHOLDER.sub("", template) or "}" in _PLACEHOLDER.sub("", template):
        raise ValueError("has an unmatched '{' or '}'")
    for name in names:
        if name != IDEMPOTENCY_KEY and _PAYLOAD_FIELD.fullmatch(name) is None:
            raise ValueError(
                f"unknown placeholder {{{name}}} (known: {{{IDEMPOTENCY_KEY}}},"
                " {payload.<field>})"
            )
    return names


def render_url(template: str, idempotency_key: str, payload: Mapping[str, Any]) -> str:
    """`template` with each placeholder's value, percent-encoded; ValueError naming a payload
    field that is missing or not a string or an integer."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name == IDEMPOTENCY_KEY:
            return quote(idempotency_key, safe="")
        field = name.removeprefix("payload.")
        found = payload.get(field)
        if isinstance(found, bool) or not isinstance(found, str | int) or found == "":
            raise ValueError(
                f"payload.{field} must be a non-empty string or an integer: the destination's"
                f" URL names it ({{{name}}})"
            )
        return quote(str(found), safe="")

    placeholders(template)
    return _PLACEHOLDER.sub(value, template)


def body_bytes(payload: Mapping[str, Any]) -> bytes:
    """The request body: the payload as compact JSON (ValueError for NaN or Infinity)."""
    return json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()


def check_http_payload(settings: Mapping[str, Any], payload: Mapping[str, Any]) -> None:
    """Refuse a payload the destination could never send: `BodyTooLarge` over its
    `max_body_bytes`, ValueError naming a field its URL templates need."""
    limit = int(settings.get("max_body_bytes") or DEFAULT_MAX_BODY_BYTES)
    size = len(body_bytes(payload))
    if size > limit:
        raise BodyTooLarge(
            f"payload is {size} bytes as JSON; the destination takes at most {limit}"
            " (its max_body_bytes)"
        )
    for setting in ("url", "status_url"):
        template = settings.get(setting)
        if isinstance(template, str):
            render_url(template, "", payload)
