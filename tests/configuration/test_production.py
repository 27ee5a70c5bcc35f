"""What a production process refuses to start with: plain payloads and each credential of the
fake provider and `make dev` that this repository publishes, named by destination and field."""

from __future__ import annotations

from pathlib import Path

import pytest
from durable_outbox_temporal.codec import EncryptionCodec, new_key_setting

from configuration.destinations import load_destinations
from configuration.production import (
    InsecureConfiguration,
    open_payloads,
    public_credentials,
    refuse_open_production,
)
from configuration.settings import (
    PROJECT_ROOT,
    PUBLIC_ACS_ACCESS_KEY,
    PUBLIC_WEBHOOK_SECRET,
    Settings,
)
from devstack import fake_provider

SHIPPED = PROJECT_ROOT / "config" / "destinations.toml"


def test_the_fakes_defaults_are_the_published_values() -> None:
    # The fake provider and the checks must mean the same credentials.
    assert fake_provider.DEFAULT_ACS_ACCESS_KEY == PUBLIC_ACS_ACCESS_KEY
    assert fake_provider.DEFAULT_WEBHOOK_SECRET == PUBLIC_WEBHOOK_SECRET


def test_the_shipped_destinations_name_every_public_credential(monkeypatch) -> None:
    for name in (
        "FAKE_EMAIL_EVENTS_SECRET",
        "FAKE_ACS_ACCESS_KEY",
        "FAKE_WEBHOOK_SECRET",
        "FAKE_PAYMENT_TOKEN",
    ):
        monkeypatch.delenv(name, raising=False)

    reasons = public_credentials(load_destinations(SHIPPED))

    assert reasons == [
        "destination 'fake-email' takes delivery reports with the public development events_secret",
        "destination 'fake-email' signs with the fake provider's public settings.access_key",
        "destination 'fake-webhook' signs with the fake provider's public settings.secret",
        "destination 'fake-sms' takes delivery reports with the public development events_secret",
        "destination 'fake-sms' signs with the fake provider's public settings.access_key",
        "destination 'fake-payments' signs with the fake provider's public settings.token",
    ]


def test_private_credentials_and_payload_keys_leave_nothing_open(monkeypatch) -> None:
    monkeypatch.setenv("FAKE_EMAIL_EVENTS_SECRET", "a-private-events-secret")
    monkeypatch.setenv("FAKE_ACS_ACCESS_KEY", "cHJpdmF0ZSBrZXk=")
    monkeypatch.setenv("FAKE_WEBHOOK_SECRET", "whsec_cHJpdmF0ZSBzZWNyZXQ=")
    monkeypatch.setenv("FAKE_PAYMENT_TOKEN", "sk_a_private_payment_token")
    codec = EncryptionCodec.from_setting(new_key_setting("k1"))

    assert public_credentials(load_destinations(SHIPPED)) == []
    assert open_payloads(codec) == []
    assert any("PAYLOAD_KEYS" in reason for reason in open_payloads(None))


def test_a_rotated_out_public_webhook_secret_is_still_refused(tmp_path: Path) -> None:
    config = tmp_path / "destinations.toml"
    config.write_text(
        "[destinations.hooks]\nprovider = 'webhook'\n[destinations.hooks.settings]\n"
        "url = 'https://example.com/hook'\nsecret = 'whsec_cHJpdmF0ZSBzZWNyZXQ='\n"
        f"previous_secret = '{PUBLIC_WEBHOOK_SECRET}'\n"
        "previous_secret_until = 2099-01-01T00:00:00Z\n"
    )

    reasons = public_credentials(load_destinations(config))

    assert reasons == [
        "destination 'hooks' signs with the fake provider's public settings.previous_secret"
    ]


@pytest.mark.parametrize(
    ("environment", "allow_insecure", "refused"),
    [
        ("production", False, True),
        ("production", True, False),
        ("development", False, False),
    ],
)
def test_only_production_refuses_and_allow_insecure_lets_it_start(
    environment: str, allow_insecure: bool, refused: bool
) -> None:
    settings = Settings(_env_file=None, outbox_env=environment, allow_insecure=allow_insecure)  # type: ignore[call-arg]
    reasons = ["no payload keys (PAYLOAD_KEYS or PAYLOAD_KEYS_FILE): plain payloads"]

    if refused:
        with pytest.raises(InsecureConfiguration, match=r"production worker .*PAYLOAD_KEYS"):
            refuse_open_production("worker", settings, reasons)
    else:
        refuse_open_production("worker", settings, reasons)
    refuse_open_production("worker", Settings(_env_file=None, outbox_env="production"), [])  # type: ignore[call-arg]
