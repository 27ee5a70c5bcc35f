"""`/docs` (Swagger UI) and `/redoc` with their scripts and styles served by the API itself, so
both work where no CDN can be reached. Open, like `/openapi.json` (see api/auth.py).

Neither page holds an inline script: the Content-Security-Policy (`api/security.py`) allows
only the API's own script files, so Swagger UI starts from `static/docs/swagger-init.js`.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_PATH = "/docs-assets"
# fastapi-offline ships the Swagger UI and Redoc builds FastAPI would otherwise take from a CDN.
_ASSETS_PACKAGE = ("fastapi_offline", "static")
# Ours: what the pages would otherwise hold inline.
OWN_ASSETS = Path(__file__).resolve().parent.parent / "static" / "docs"

router = APIRouter(include_in_schema=False)


def assets() -> StaticFiles:
    """The app to mount at `ASSETS_PATH`: the packaged JS, CSS and favicon, and our own."""
    return StaticFiles(directory=OWN_ASSETS, packages=[_ASSETS_PACKAGE])


def _prefix(request: Request) -> str:
    # Behind a proxy that strips a path prefix, the page must ask for its files under it.
    return str(request.scope.get("root_path", "")).rstrip("/")


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    """Swagger UI over the OpenAPI schema: every operation, with a form to try it."""
    prefix = _prefix(request)
    assets_url = f"{prefix}{ASSETS_PATH}"
    schema_url = escape(prefix + request.app.openapi_url)
    return HTMLResponse(
        _page(
            f"{request.app.title} - Swagger UI",
            head=f'<link rel="stylesheet" href="{assets_url}/swagger-ui.css">',
            body=(
                f'<div id="swagger-ui" data-openapi-url="{schema_url}"></div>\n'
                f'<script src="{assets_url}/swagger-ui-bundle.js"></script>\n'
                f'<script src="{assets_url}/swagger-init.js"></script>'
            ),
            favicon=f"{assets_url}/favicon.png",
        )
    )


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    """Redoc over the OpenAPI schema: the same operations as one long page."""
    prefix = _prefix(request)
    assets_url = f"{prefix}{ASSETS_PATH}"
    return HTMLResponse(
        _page(
            f"{request.app.title} - ReDoc",
            head=f'<link rel="stylesheet" href="{assets_url}/redoc.css">',
            body=(
                "<noscript>ReDoc needs JavaScript to show the documentation.</noscript>\n"
                f'<redoc spec-url="{escape(prefix + request.app.openapi_url)}"></redoc>\n'
                f'<script src="{assets_url}/redoc.standalone.js"></script>'
            ),
            favicon=f"{assets_url}/favicon.png",
        )
    )


def _page(title: str, *, head: str, body: str, favicon: str) -> str:
    return (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(title)}</title>\n"
        f'<link rel="icon" href="{favicon}">\n{head}\n</head>\n<body>\n{body}\n</body>\n</html>\n'
    )
