"""`GET /v1/token`: what the caller's token may do, so a client (the dashboard) can offer only
that. Any valid token may ask, whatever its scopes."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel

from api.auth import ALL_SCOPES, TOKEN_ROUTE, ApiToken

router = APIRouter(tags=["token"])


class TokenInfo(BaseModel):
    # The token's name from API_TOKENS_FILE (never the token); null when the API runs open.
    name: str | None
    scopes: list[str]
    # Null: every outbox.
    outboxes: list[str] | None


@router.get(TOKEN_ROUTE, response_model=TokenInfo, summary="What this token may do")
async def token_info(request: Request) -> TokenInfo:
    token: ApiToken | None = getattr(request.state, "token", None)
    if token is None:  # the API runs open: everything, everywhere
        return TokenInfo(name=None, scopes=sorted(ALL_SCOPES), outboxes=None)
    return TokenInfo(
        name=token.name,
        scopes=sorted(token.scopes),
        outboxes=None if token.outboxes is None else sorted(token.outboxes),
    )
