"""A deprecated route says so on every answer: `Deprecation` (RFC 9745, the moment it was
deprecated) and `Sunset` (RFC 8594, the earliest it may go), with a `Link` to what replaces it.

    @router.get("/v1/old", **deprecated(since=..., sunset=..., successor="/v1/new"))

marks the operation deprecated in the OpenAPI document too. A deprecated request field is
announced by the route that reads it: `announce_deprecation(response, notice)` when the request
sent it. Every deprecation is listed in CHANGELOG.md under the release that made it; nothing
`/v1` offers goes before its sunset (docs/how-to/upgrade.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from email.utils import format_datetime
from typing import Any

from fastapi import Depends, Response


@dataclass(frozen=True)
class DeprecationNotice:
    """When something was deprecated, the earliest it may be removed, and its replacement."""

    since: datetime
    sunset: datetime
    successor: str | None = None

    def headers(self) -> dict[str, str]:
        headers = {
            "Deprecation": f"@{int(self.since.timestamp())}",
            "Sunset": format_datetime(self.sunset, usegmt=True),
        }
        if self.successor:
            headers["Link"] = f'<{self.successor}>; rel="successor-version"'
        return headers


def announce_deprecation(response: Response, notice: DeprecationNotice) -> None:
    """Put the notice's headers on `response`."""
    response.headers.update(notice.headers())


def deprecated(
    *, since: datetime, sunset: datetime, successor: str | None = None
) -> dict[str, Any]:
    """Route decorator arguments for a deprecated operation: marked in the OpenAPI document, and
    every answer carries the headers."""
    notice = DeprecationNotice(since, sunset, successor)

    async def announce(response: Response) -> None:
        announce_deprecation(response, notice)

    announce.deprecation = notice  # type: ignore[attr-defined]
    return {
        "deprecated": True,
        "dependencies": [Depends(announce)],
        "openapi_extra": {"x-sunset": notice.sunset.isoformat()},
    }
