"""The dashboard at `/` (outboxes) and `/aggregates`: static pages; everything they show comes
from the API and the live feeds. Their scripts and styles are files under `STATIC_PATH`, never
inline: the Content-Security-Policy (`api/security.py`) runs the API's own script files only."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

router = APIRouter(include_in_schema=False)

STATIC_PATH = "/static"
_STATIC = Path(__file__).resolve().parent.parent / "static"
_PAGE = _STATIC / "dashboard.html"


def assets() -> StaticFiles:
    """The app to mount at `STATIC_PATH`: the pages' scripts and styles."""
    return StaticFiles(directory=_STATIC)


@router.get("/")
async def dashboard() -> FileResponse:
    # The page holds no data (it asks the API with the user's token), so it is served openly.
    return FileResponse(_PAGE, media_type="text/html")


@router.get("/aggregates")
async def aggregates_page() -> FileResponse:
    """Aggregates: pick a type and an id, see state and events live, send a command."""
    return FileResponse(_STATIC / "aggregates.html", media_type="text/html")
