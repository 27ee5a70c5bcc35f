"""`GET /v1/token`: what the caller's token may do, so a client (the dashboard) can offer only
that. Any valid token may ask, whatever its scopes."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from api.auth import ALL_SCOPES, SESSION_COOKIE, SESSION_ROUTE, TOKEN_ROUTE, ApiToken

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


@router.post(SESSION_ROUTE, status_code=204, summary="Let the Web UI's codec calls use this token")
async def start_session(request: Request, response: Response) -> None:
    """Set the caller's token as an HttpOnly cookie for `/codec/` only, so the Temporal Web UI
    (same host, another port: same site) can decrypt payloads with "include cross-origin
    credentials" on. The dashboard calls it when a token is entered; `DELETE` ends it."""
    authorization = request.headers.get("authorization", "")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return  # the API runs open: the codec server needs no cookie
    response.set_cookie(
        SESSION_COOKIE,
        token.strip(),
        httponly=True,
        samesite="lax",
        path="/codec",
        max_age=8 * 3600,
    )


@router.delete(SESSION_ROUTE, status_code=204, summary="End the Web UI's codec session")
async def end_session(response: Response) -> None:
    response.delete_cookie(SESSION_COOKIE, path="/codec")
