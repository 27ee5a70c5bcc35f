"""Deprecated routes answer with `Deprecation` and `Sunset` headers and are marked in the OpenAPI
document; a route marked deprecated any other way fails here."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
from fastapi import APIRouter, FastAPI, Response
from fastapi.routing import APIRoute

from api.deprecation import DeprecationNotice, announce_deprecation, deprecated
from api.main import create_app
from tests.api.conftest import api_settings

SINCE = datetime(2026, 11, 1, tzinfo=UTC)
SUNSET = datetime(2027, 5, 1, tzinfo=UTC)


def _app() -> FastAPI:
    router = APIRouter()

    @router.get("/v1/old", **deprecated(since=SINCE, sunset=SUNSET, successor="/v1/new"))
    async def old() -> dict[str, str]:
        return {"ok": "old"}

    @router.get("/v1/reads-a-field")
    async def reads_a_field(response: Response, legacy: str | None = None) -> dict[str, str]:
        if legacy is not None:
            announce_deprecation(response, DeprecationNotice(SINCE, SUNSET))
        return {"ok": "field"}

    @router.get("/v1/new")
    async def new() -> dict[str, str]:
        return {"ok": "new"}

    app = FastAPI()
    app.include_router(router)
    return app


async def test_a_deprecated_route_answers_with_deprecation_and_sunset() -> None:
    app = _app()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        old, new = await http.get("/v1/old"), await http.get("/v1/new")
        field = await http.get("/v1/reads-a-field", params={"legacy": "x"})
        without = await http.get("/v1/reads-a-field")

    assert old.json() == {"ok": "old"}
    assert old.headers["deprecation"] == f"@{int(SINCE.timestamp())}"
    assert old.headers["sunset"] == "Sat, 01 May 2027 00:00:00 GMT"
    assert old.headers["link"] == '</v1/new>; rel="successor-version"'
    assert "deprecation" not in new.headers and "sunset" not in new.headers
    assert field.headers["sunset"] == "Sat, 01 May 2027 00:00:00 GMT"
    assert "deprecation" not in without.headers
    operation = app.openapi()["paths"]["/v1/old"]["get"]
    assert operation["deprecated"] is True and operation["x-sunset"] == SUNSET.isoformat()


def test_every_deprecated_route_of_the_app_announces_its_sunset() -> None:
    app = create_app(api_settings())
    for route in app.routes:
        if isinstance(route, APIRoute) and route.deprecated:
            notices = [
                getattr(dependency.dependency, "deprecation", None)
                for dependency in route.dependencies
            ]
            assert any(notices), f"{route.path} is deprecated without `api.deprecation.deprecated`"
