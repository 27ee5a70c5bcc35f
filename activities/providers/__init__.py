"""Provider registry: a provider kind names the class that delivers to it.

Each kind's settings model lives in `configuration/providers.py`, which checks a destinations file
without importing this package; a test keeps the two registries listing the same kinds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import httpx
from durable_outbox_temporal.destinations import Destination, DestinationConfigError
from pydantic import BaseModel

from activities.providers.acs_email import AcsEmailProvider
from activities.providers.acs_sms import AcsSmsProvider
from activities.providers.base import Provider
from activities.providers.http_call import HttpCallProvider
from activities.providers.webhook import WebhookProvider
from configuration.providers import (
    AcsEmailSettings,
    AcsSmsSettings,
    HttpCallSettings,
    WebhookSettings,
)

SettingsT = TypeVar("SettingsT", bound=BaseModel)


@dataclass(frozen=True)
class ProviderKind(Generic[SettingsT]):
    """One provider kind: the model its `settings` must fit and the class built from them."""

    settings_model: type[SettingsT]
    factory: Callable[[SettingsT, httpx.AsyncClient], Provider]

    def build(self, destination: Destination, http_client: httpx.AsyncClient) -> Provider:
        return self.factory(destination.settings_as(self.settings_model), http_client)


PROVIDERS: dict[str, ProviderKind[Any]] = {
    AcsEmailProvider.kind: ProviderKind(AcsEmailSettings, AcsEmailProvider),
    AcsSmsProvider.kind: ProviderKind(AcsSmsSettings, AcsSmsProvider),
    WebhookProvider.kind: ProviderKind(WebhookSettings, WebhookProvider),
    HttpCallProvider.kind: ProviderKind(HttpCallSettings, HttpCallProvider),
}


def build_provider(destination: Destination, http_client: httpx.AsyncClient) -> Provider:
    """The provider for `destination`; raises DestinationConfigError naming what is wrong."""
    provider = PROVIDERS.get(destination.provider)
    if provider is None:
        known = ", ".join(sorted(PROVIDERS))
        raise DestinationConfigError(
            f"destination {destination.name!r}: provider: unknown provider"
            f" {destination.provider!r} (known: {known})"
        )
    return provider.build(destination, http_client)
