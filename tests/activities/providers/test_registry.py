"""The provider registry: each configured kind has a class, built from its checked settings."""

from __future__ import annotations

import httpx
import pytest
from durable_outbox_temporal.destinations import Destination

from activities.providers import PROVIDERS, build_provider
from activities.providers.acs_email import AcsEmailProvider
from activities.providers.acs_sms import AcsSmsProvider
from activities.providers.http_call import HttpCallProvider
from activities.providers.webhook import WebhookProvider
from configuration.destinations import load_destinations
from configuration.providers import PROVIDER_SETTINGS
from configuration.settings import PROJECT_ROOT
from tests.conftest import ACS_ACCESS_KEY, WEBHOOK_SECRET

EMAIL_SETTINGS = {"endpoint": "https://acs.test", "access_key": ACS_ACCESS_KEY}
WEBHOOK_SETTINGS = {"url": "https://receiver.test/hook", "secret": WEBHOOK_SECRET}


def test_the_classes_and_the_configured_settings_name_the_same_kinds_and_models() -> None:
    """A kind the API accepts the worker can build, with the model the API checked it against."""
    built_from = {kind: provider.settings_model for kind, provider in PROVIDERS.items()}

    assert built_from == dict(PROVIDER_SETTINGS)


async def test_build_provider_builds_each_kind_from_its_settings() -> None:
    email = Destination(name="mail", provider="acs-email", settings=EMAIL_SETTINGS)
    hook = Destination(name="hook", provider="webhook", settings=WEBHOOK_SETTINGS)
    sms = Destination(name="sms", provider="acs-sms", settings=EMAIL_SETTINGS)
    pay = Destination(name="pay", provider="http", settings={"url": "https://pay.test/charges"})

    async with httpx.AsyncClient() as http:
        assert isinstance(build_provider(email, http), AcsEmailProvider)
        assert isinstance(build_provider(sms, http), AcsSmsProvider)
        assert isinstance(build_provider(hook, http), WebhookProvider)
        assert isinstance(build_provider(pay, http), HttpCallProvider)


async def test_build_provider_names_the_destination_and_field() -> None:
    async with httpx.AsyncClient() as http:
        with pytest.raises(ValueError, match="'x': provider: unknown provider 'sms'"):
            build_provider(Destination(name="x", provider="sms"), http)
        with pytest.raises(ValueError, match="'x': settings.url: Field required"):
            build_provider(Destination(name="x", provider="webhook"), http)


# Each shipped file's destinations and their provider kinds.
SHIPPED_CONFIGS = {
    "config/destinations.toml": {
        "fake-email": "acs-email",
        "fake-webhook": "webhook",
        "fake-sms": "acs-sms",
        "fake-payments": "http",
    },
    "bench/destinations.toml": {
        "bench-email": "acs-email",
        "bench-two-activities": "acs-email",
        "bench-wait": "acs-email",
        "bench-bulk": "acs-email",
        "bench-bulk-wait": "acs-email",
    },
    "bench/chaos_destinations.toml": {"chaos-email": "acs-email", "chaos-webhook": "webhook"},
}
# The env vars those files reference, set to sample values.
SAMPLE_ENV = {
    "FAKE_PROVIDER_URL": "http://127.0.0.1:8025",
    "FAKE_ACS_ACCESS_KEY": ACS_ACCESS_KEY,
    "FAKE_WEBHOOK_SECRET": WEBHOOK_SECRET,
    "FAKE_PAYMENT_TOKEN": "sk_test_token",
}


@pytest.mark.parametrize(("path", "kinds"), sorted(SHIPPED_CONFIGS.items()))
async def test_shipped_destination_files_load_and_build(path: str, kinds: dict[str, str]) -> None:
    registry = load_destinations(PROJECT_ROOT / path, SAMPLE_ENV)

    async with httpx.AsyncClient() as http:
        built = {d.name: build_provider(d, http).kind for d in registry}

    assert built == kinds
