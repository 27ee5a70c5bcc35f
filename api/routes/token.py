"""`GET /v1/token`: what the caller's token may do, so a client (the dashboard) can offer only
that. Any valid token may ask, whatever its scopes."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from api.auth import (
    ALL_SCOPES,
    SESSION_COOKIE,
    SESSION_ROUTE,
    SESSION_TTL_S,
    TOKEN_ROUTE,
    ApiToken,
    Scope,
    refusal,
    session_value,
)
from api.errors import ApiProblem

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
    """Set an HttpOnly cookie for `/codec/` only, so the Temporal Web UI (same host, another
    port: same site) can decrypt payloads with "include cross-origin credentials" on. Its value
    is a signed session good for an hour, naming the caller's token without holding it; `Secure`
    when the request came over HTTPS (or a proxy says it did). The dashboard calls it each time
    it loads a token; `DELETE` ends it. A token the codec would refuse (one limited to some
    outboxes, or without `read`) gets 403 rather than a cookie it could never use."""
    token: ApiToken | None = getattr(request.state, "token", None)
    if token is None:
        return  # the API runs open: the codec server needs no cookie
    why = refusal(token, Scope.READ, None)
    if why is not None:
        raise ApiProblem(
            403, "forbidden", "Forbidden", f"no codec session: {why}", missing_scope=Scope.READ
        )
    forwarded = request.headers.get("x-forwarded-proto", "").partition(",")[0].strip().lower()
    response.set_cookie(
        SESSION_COOKIE,
        session_value(token, request.app.state.session_key),
        httponly=True,
        secure=request.url.scheme == "https" or forwarded == "https",
        samesite="strict",
        path="/codec",
        max_age=SESSION_TTL_S,
    )


@router.delete(SESSION_ROUTE, status_code=204, summary="End the Web UI's codec session")
async def end_session(response: Response) -> None:
    response.delete_cookie(SESSION_COOKIE, path="/codec", httponly=True, samesite="strict")
