"""`/docs` (Swagger UI) and `/redoc` with their scripts and styles served by the API itself, so
both work where no CDN can be reached. Open, like `/openapi.json` (see api/auth.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_PATH = "/docs-assets"
# fastapi-offline ships the Swagger UI and Redoc builds FastAPI would otherwise take from a CDN.
_ASSETS_PACKAGE = ("fastapi_offline", "static")

router = APIRouter(include_in_schema=False)


def assets() -> StaticFiles:
    """The app to mount at `ASSETS_PATH`: the packaged JS, CSS and favicon."""
    return StaticFiles(packages=[_ASSETS_PACKAGE])


def _prefix(request: Request) -> str:
    # Behind a proxy that strips a path prefix, the page must ask for its files under it.
    return str(request.scope.get("root_path", "")).rstrip("/")


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    """Swagger UI over the OpenAPI schema: every operation, with a form to try it."""
    prefix = _prefix(request)
    return get_swagger_ui_html(
        openapi_url=f"{prefix}{request.app.openapi_url}",
        title=f"{request.app.title} - Swagger UI",
        swagger_js_url=f"{prefix}{ASSETS_PATH}/swagger-ui-bundle.js",
        swagger_css_url=f"{prefix}{ASSETS_PATH}/swagger-ui.css",
        swagger_favicon_url=f"{prefix}{ASSETS_PATH}/favicon.png",
        # Otherwise the page shows a badge that sends the schema to validator.swagger.io.
        swagger_ui_parameters={"validatorUrl": None},
    )


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    """Redoc over the OpenAPI schema: the same operations as one long page."""
    prefix = _prefix(request)
    return get_redoc_html(
        openapi_url=f"{prefix}{request.app.openapi_url}",
        title=f"{request.app.title} - ReDoc",
        redoc_js_url=f"{prefix}{ASSETS_PATH}/redoc.standalone.js",
        redoc_favicon_url=f"{prefix}{ASSETS_PATH}/favicon.png",
        with_google_fonts=False,
    )
