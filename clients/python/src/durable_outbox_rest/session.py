"""What every request carries, for both clients."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

DEFAULT_TIMEOUT_S = 10.0

try:
    VERSION = version("durable-outbox-client")
except PackageNotFoundError:  # run from a source tree without installing
    VERSION = "0"


def request_headers(token: str | None) -> dict[str, str]:
    """The headers of every request: who calls, what it accepts, its token."""
    headers = {"Accept": "application/json", "User-Agent": f"durable-outbox-client/{VERSION}"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return headers
