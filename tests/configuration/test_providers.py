"""Each provider kind's settings, checked when the destinations file loads, errors by name."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from durable_outbox_temporal.destinations import DestinationConfigError, DestinationRegistry
from pydantic import ValidationError

from configuration.destinations import load_destinations
from configuration.providers import (
    DEFAULT_MAX_RETRY_AFTER_S,
    PROVIDER_SETTINGS,
    RETRY_AFTER_LIMIT_S,
    AcsEmailSettings,
    HttpCallSettings,
    HttpProviderSettings,
    WebhookSettings,
)
from configuration.settings import PROJECT_ROOT
from tests.conftest import ACS_ACCESS_KEY, WEBHOOK_SECRET

EMAIL_SETTINGS = {"endpoint": "https://acs.test", "access_key": ACS_ACCESS_KEY}
WEBHOOK_SETTINGS = {"url": "https://receiver.test/hook", "secret": WEBHOOK_SECRET}
PAY_SETTINGS = {"url": "https://pay.test/v1/charges", "auth": "bearer", "token": "sk_live_x"}


def load(provider: str, settings: dict[str, Any]) -> DestinationRegistry:
    raw = {"fake-email": {"provider": provider, "settings": settings}}
    return DestinationRegistry.from_mapping(raw, {}, provider_settings=PROVIDER_SETTINGS)


@pytest.mark.parametrize(
    ("provider", "settings", "problem"),
    [
        ("acs-email", {"access_key": ACS_ACCESS_KEY}, "settings.endpoint: Field required"),
        ("acs-email", {**EMAIL_SETTINGS, "access_key": "not base64!"}, "settings.access_key: must"),
        ("acs-email", {**EMAIL_SETTINGS, "access_key": ""}, "settings.access_key: must be base64"),
        ("acs-email", {**EMAIL_SETTINGS, "endpoint": "acs.test"}, "settings.endpoint: must be an"),
        ("acs-email", {**EMAIL_SETTINGS, "timeout_s": 0}, "settings.timeout_s: .*greater than 0"),
        ("acs-email", {**EMAIL_SETTINGS, "acces_key": "eA=="}, "settings.acces_key: unknown field"),
        (
            "acs-email",
            {**EMAIL_SETTINGS, "repeatability_window_s": 0},
            "settings.repeatability_window_s: .*greater than 0",
        ),
        ("acs-sms", {"access_key": ACS_ACCESS_KEY}, "settings.endpoint: Field required"),
        ("acs-sms", {"endpoint": "https://acs.test"}, "settings.access_key: Field required"),
        ("acs-sms", {**EMAIL_SETTINGS, "access_key": "not base64!"}, "settings.access_key: must"),
        ("acs-sms", {**EMAIL_SETTINGS, "endpoint": "acs.test"}, "settings.endpoint: must be an"),
        ("acs-sms", {**EMAIL_SETTINGS, "sender": "+1555"}, "settings.sender: unknown field"),
        ("webhook", {"url": "https://receiver.test"}, "settings.secret: Field required"),
        ("webhook", {**WEBHOOK_SETTINGS, "secret": "whsec_!!"}, "settings.secret: must be 'whsec_"),
        ("webhook", {**WEBHOOK_SETTINGS, "url": "ftp://x"}, "settings.url: must be an http"),
        ("webhook", {**WEBHOOK_SETTINGS, "headers": "x"}, "settings.headers: "),
        ("http", {"auth": "none"}, "settings.url: Field required"),
        ("http", {**PAY_SETTINGS, "token": None}, "token: required with auth = 'bearer'"),
        ("http", {**PAY_SETTINGS, "auth": "basic"}, "username, password: required with auth"),
        ("http", {**PAY_SETTINGS, "auth": "none"}, "token: not used with auth = 'none'"),
        (
            "http",
            {**PAY_SETTINGS, "status_url": "https://other.test/{idempotency_key}"},
            "status_url: must be on url's scheme, host and port",
        ),
        ("http", {**PAY_SETTINGS, "auth": "header"}, "auth_header: required with auth = 'header'"),
        ("http", {**PAY_SETTINGS, "auth": "oauth"}, "settings.auth: Input should be 'none'"),
        (
            "http",
            {**PAY_SETTINGS, "url": "https://pay.test/{order}"},
            "settings.url: unknown placeholder \\{order\\}",
        ),
        (
            "http",
            {**PAY_SETTINGS, "status_url": "https://pay.test/{payload.id"},
            "settings.status_url: has an unmatched",
        ),
        (
            "http",
            {**PAY_SETTINGS, "url": "https://{payload.host}/x"},
            "settings.url: may not have a placeholder in its host",
        ),
        (
            "http",
            {**PAY_SETTINGS, "url": "pay.test/{idempotency_key}"},
            "settings.url: must be an http",
        ),
        ("http", {**PAY_SETTINGS, "method": "GET"}, "settings.method: Input should be"),
        (
            "http",
            {**PAY_SETTINGS, "max_body_bytes": 0},
            "settings.max_body_bytes: .*greater than 0",
        ),
        ("http", {**PAY_SETTINGS, "idempotency_window_s": 0}, "settings.idempotency_window_s: "),
    ],
)
def test_bad_settings_are_refused_at_load_naming_destination_and_field(
    provider: str, settings: dict[str, Any], problem: str
) -> None:
    with pytest.raises(
        DestinationConfigError, match=f"^<config>: destination 'fake-email': {problem}"
    ):
        load(provider, settings)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(DestinationConfigError) as error:
        load("webhook", {"url": "x", "secret": "y!"})

    assert "settings.url: " in str(error.value) and "settings.secret: " in str(error.value)


def test_unknown_provider_kind_is_refused_at_load_listing_the_known_ones() -> None:
    with pytest.raises(
        DestinationConfigError,
        match=r"destination 'fake-email': provider: unknown provider 'sms' \(known: acs-email,"
        r" acs-sms, http, webhook\)",
    ):
        load("sms", {})


def test_settings_overridden_from_the_environment_are_checked_too(tmp_path: Path) -> None:
    config = tmp_path / "destinations.toml"
    config.write_text(
        '[destinations.hook]\nprovider = "webhook"\n[destinations.hook.settings]\n'
        f'url = "https://receiver.test"\nsecret = "{WEBHOOK_SECRET}"\n'
    )

    with pytest.raises(DestinationConfigError, match=r"'hook': settings.secret: must be 'whsec_'"):
        load_destinations(config, {"DEST_HOOK_SETTINGS_SECRET": "whsec_not base64"})


def test_valid_settings_become_the_providers_typed_settings() -> None:
    destination = load("acs-email", {**EMAIL_SETTINGS, "timeout_s": "2.5"}).get("fake-email")

    assert destination is not None
    settings = destination.settings_as(AcsEmailSettings)
    assert (settings.endpoint, settings.timeout_s, settings.headers) == (
        "https://acs.test",
        2.5,
        {},
    )


def test_max_retry_after_s_is_bounded_in_the_settings() -> None:
    assert HttpProviderSettings().max_retry_after_s == DEFAULT_MAX_RETRY_AFTER_S
    assert HttpProviderSettings(max_retry_after_s=RETRY_AFTER_LIMIT_S).max_retry_after_s > 0
    for bad in (0, -1, RETRY_AFTER_LIMIT_S + 1, math.inf):
        with pytest.raises(ValidationError):
            HttpProviderSettings(max_retry_after_s=bad)


def test_dev_config_loads_with_no_environment_at_all() -> None:
    """`make dev` needs no env: every reference in the dev config has a default."""
    registry = load_destinations(PROJECT_ROOT / "config" / "destinations.toml", {})

    assert registry.get("fake-webhook").settings["url"].startswith("http://127.0.0.1:8025/")  # type: ignore[union-attr]


def test_a_rotation_window_loads_from_toml_and_from_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "destinations.toml"
    path.write_text(
        f"""
[destinations.hook]
provider = "webhook"
[destinations.hook.settings]
url = "https://receiver.test/hook"
secret = "whsec_bmV3LXdlYmhvb2stc2lnbmluZy1zZWNyZXQ="
previous_secret = "{WEBHOOK_SECRET}"
previous_secret_until = 2026-12-08T00:00:00Z
max_retry_after_s = 86400
"""
    )

    from_file = load_destinations(path, {}).get("hook")
    moved = load_destinations(
        path, {"DEST_HOOK_SETTINGS_PREVIOUS_SECRET_UNTIL": "2026-12-09T00:00:00+01:00"}
    ).get("hook")

    assert from_file is not None and moved is not None
    settings = from_file.settings_as(WebhookSettings)
    assert settings.previous_secret == WEBHOOK_SECRET and settings.max_retry_after_s == 86400
    assert settings.previous_secret_until == datetime(2026, 12, 8, tzinfo=UTC)
    assert moved.settings_as(WebhookSettings).previous_secret_until == datetime(
        2026, 12, 8, 23, tzinfo=UTC
    )
    local = {"DEST_HOOK_SETTINGS_PREVIOUS_SECRET_UNTIL": "2026-12-08T00:00:00"}
    with pytest.raises(DestinationConfigError, match="previous_secret_until: .*timezone"):
        load_destinations(path, local)


def test_http_credentials_never_show_in_the_settings_text() -> None:
    destination = load("http", {**PAY_SETTINGS, "auth": "header", "auth_header": "X-Api-Key"})
    settings = destination.get("fake-email").settings_as(HttpCallSettings)  # type: ignore[union-attr]

    assert settings.token is not None and settings.token.get_secret_value() == "sk_live_x"
    assert "sk_live_x" not in repr(settings) and "sk_live_x" not in str(settings)
