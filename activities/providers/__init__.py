"""Provider registry: a provider kind names one module's class."""

from __future__ import annotations

import httpx

from activities.providers.acs_email import AcsEmailProvider
from activities.providers.base import Provider, ProviderFactory
from activities.providers.webhook import WebhookProvider
from common.destinations import Destination

PROVIDERS: dict[str, ProviderFactory] = {
    AcsEmailProvider.kind: AcsEmailProvider,
    WebhookProvider.kind: WebhookProvider,
}


def build_provider(destination: Destination, http_client: httpx.AsyncClient) -> Provider:
    """The provider for `destination`; raises ValueError naming what is wrong with its config."""
    factory = PROVIDERS.get(destination.provider)
    if factory is None:
        known = ", ".join(sorted(PROVIDERS))
        raise ValueError(
            f"destination {destination.name!r}: unknown provider {destination.provider!r}"
            f" (known: {known})"
        )
    try:
        return factory(destination.settings, http_client)
    except ValueError as err:
        raise ValueError(f"destination {destination.name!r}: {err}") from err
