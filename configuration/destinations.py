"""Reading the destinations file, each destination's provider settings checked on the way in."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from durable_outbox_temporal.destinations import DestinationRegistry

from configuration.providers import PROVIDER_SETTINGS


def load_destinations(path: Path, environ: Mapping[str, str] | None = None) -> DestinationRegistry:
    """The destinations in `path`, each one's provider settings checked; raises on any error.

    Every process reads the file through this, so a bad key or URL stops start-up with a clear
    message."""
    return DestinationRegistry.from_file(path, environ, provider_settings=PROVIDER_SETTINGS)
