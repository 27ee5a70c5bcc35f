"""What each provider kind refuses in an item's payload, checked where the item is enqueued and
where a schedule's template is checked: refused there, a payload is a 4xx to its caller rather
than a delivery that fails on every attempt."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from durable_outbox_temporal.contract import http_call, sms


def check_payload_for(provider: str, settings: Mapping[str, Any], payload: dict[str, Any]) -> None:
    """Refuse (ValueError naming the field; `http_call.BodyTooLarge` for a body over the
    destination's limit) a payload the destination's provider kind can never send. Kinds not
    named here take any JSON object."""
    if provider == sms.ACS_SMS:
        sms.check_sms_payload(payload)
    elif provider == http_call.HTTP_CALL:
        http_call.check_http_payload(settings, payload)
