"""Bearer-token auth: when `API_TOKEN` is set, every /v1 route (WebSockets too) requires it."""

from __future__ import annotations

import hmac

from fastapi import Request, WebSocket

from api.errors import ApiProblem


def token_is_valid(offered: str, tokens: list[str]) -> bool:
    """Constant-time comparison against every configured token."""
    return any(hmac.compare_digest(offered.encode(), token.encode()) for token in tokens)


def _check(authorization: str | None, tokens: list[str]) -> None:
    if not tokens:
        return
    scheme, _, offered = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not offered:
        raise ApiProblem(
            401,
            "unauthorized",
            "Unauthorized",
            "send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": 'Bearer realm="durable-outbox"'},
        )
    if not token_is_valid(offered.strip(), tokens):
        raise ApiProblem(403, "forbidden", "Forbidden", "the bearer token is not valid")


def require_token(request: Request) -> None:
    """Dependency for HTTP routes."""
    _check(request.headers.get("authorization"), request.app.state.resources.settings.api_tokens)


def websocket_token_is_valid(websocket: WebSocket) -> bool:
    """Browsers cannot set headers on WebSockets, so `?token=` is accepted there as well."""
    tokens: list[str] = websocket.app.state.resources.settings.api_tokens
    if not tokens:
        return True
    header = websocket.headers.get("authorization", "")
    scheme, _, offered = header.partition(" ")
    if scheme.lower() == "bearer" and token_is_valid(offered.strip(), tokens):
        return True
    return token_is_valid(websocket.query_params.get("token", ""), tokens)
