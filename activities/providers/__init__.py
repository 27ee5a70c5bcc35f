"""Provider registry: a provider kind names its settings model and its class.

`load_destinations` is how a process reads the destinations file: it checks every destination's
provider settings against this registry, so a bad key or URL stops start-up with a clear message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import httpx
from durable_outbox_temporal.destinations import (
    Destination,
    DestinationConfigError,
    DestinationRegistry,
)
from pydantic import BaseModel

from activities.providers.acs_email import AcsEmailProvider, AcsEmailSettings
from activities.providers.base import Provider
from activities.providers.webhook import WebhookProvider, WebhookSettings

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
    WebhookProvider.kind: ProviderKind(WebhookSettings, WebhookProvider),
}

PROVIDER_SETTINGS: Mapping[str, type[BaseModel]] = {
    kind: provider.settings_model for kind, provider in PROVIDERS.items()
}


def load_destinations(path: Path, environ: Mapping[str, str] | None = None) -> DestinationRegistry:
    """The destinations in `path`, each one's provider settings checked; raises on any error."""
    return DestinationRegistry.from_file(path, environ, provider_settings=PROVIDER_SETTINGS)


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
