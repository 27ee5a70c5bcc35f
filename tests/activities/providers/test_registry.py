"""Building providers from destination config: clear errors for what is wrong."""

from __future__ import annotations

import httpx
import pytest

from activities.providers import build_provider
from common.destinations import Destination


async def test_unknown_provider_and_missing_settings_are_named() -> None:
    async with httpx.AsyncClient() as http:
        with pytest.raises(ValueError, match="unknown provider 'sms'"):
            build_provider(Destination(name="x", provider="sms"), http)
        with pytest.raises(ValueError, match="'x'.*need url, secret"):
            build_provider(Destination(name="x", provider="webhook"), http)
        with pytest.raises(ValueError, match="access_key must be base64"):
            settings = {"endpoint": "http://e", "access_key": "not base64!"}
            build_provider(Destination(name="x", provider="acs-email", settings=settings), http)
