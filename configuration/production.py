"""What leaves a process open in production, checked alike by the API and the worker: plain
payloads, and credentials anyone can read in this repository (the fake provider's and `make
dev`'s). A production process refuses to start with any of them unless `ALLOW_INSECURE` is set."""

from __future__ import annotations

from collections.abc import Iterable

from durable_outbox_temporal.codec import EncryptionCodec
from durable_outbox_temporal.destinations import Destination

from configuration.settings import (
    PUBLIC_ACS_ACCESS_KEY,
    PUBLIC_EVENTS_SECRETS,
    PUBLIC_PAYMENT_TOKEN,
    PUBLIC_WEBHOOK_SECRET,
    Settings,
)

# A destination's `settings` field -> the published value it must not hold in production.
_PUBLIC_PROVIDER_CREDENTIALS = {
    "access_key": PUBLIC_ACS_ACCESS_KEY,
    "secret": PUBLIC_WEBHOOK_SECRET,
    "previous_secret": PUBLIC_WEBHOOK_SECRET,
    "token": PUBLIC_PAYMENT_TOKEN,
}


class InsecureConfiguration(RuntimeError):
    """A production process would start open; the message lists what is open."""


def open_payloads(codec: EncryptionCodec | None) -> list[str]:
    """Why payloads and the read model's copies of them are readable without payload keys."""
    if codec is not None:
        return []
    return [
        "no payload keys (PAYLOAD_KEYS or PAYLOAD_KEYS_FILE): plain payloads",
        "read model: callers' data (payloads, addresses, event details, attempt bodies,"
        " aggregate events and state) stored in plain text, without payload keys",
    ]


def public_credentials(destinations: Iterable[Destination]) -> list[str]:
    """Each destination credential that is one of the published development values, by field."""
    reasons = []
    for destination in destinations:
        secret = destination.events_secret
        if secret is not None and secret.get_secret_value() in PUBLIC_EVENTS_SECRETS:
            reasons.append(
                f"destination {destination.name!r} takes delivery reports with the public"
                " development events_secret"
            )
        for field, public in _PUBLIC_PROVIDER_CREDENTIALS.items():
            if destination.settings.get(field) == public:
                reasons.append(
                    f"destination {destination.name!r} signs with the fake provider's public"
                    f" settings.{field}"
                )
    return reasons


def refuse_open_production(process: str, settings: Settings, reasons: list[str]) -> None:
    """Raise `InsecureConfiguration` naming `reasons` if this is a production `process` that must
    not start open (`ALLOW_INSECURE` unset); nothing otherwise."""
    if reasons and settings.outbox_env == "production" and not settings.allow_insecure:
        raise InsecureConfiguration(
            f"refusing to start a production {process} (OUTBOX_ENV=production) with an open"
            f" configuration: {'; '.join(reasons)}. Set them"
            " (docs/how-to/run-in-production.md), or ALLOW_INSECURE=1 to run open on purpose."
        )
