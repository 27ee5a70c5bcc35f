"""The dashboard at `/`: one static page; everything it shows comes from the API and live feed."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

router = APIRouter(include_in_schema=False)

_PAGE = Path(__file__).resolve().parent.parent / "static" / "dashboard.html"


@router.get("/")
async def dashboard() -> FileResponse:
    # The page holds no data (it asks the API with the user's token), so it is served openly.
    return FileResponse(_PAGE, media_type="text/html")
