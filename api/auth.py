"""Bearer-token auth: with `API_TOKEN` set, every `/v1` route (the WebSocket too) requires it.

Open on purpose: `/healthz`, `/readyz` (orchestrators probe without credentials), `/metrics`
(Prometheus scrapes on the internal network; it exposes counts, never payloads), the dashboard
page (static; it asks the user for the token) and the OpenAPI docs. Missing or malformed
`Authorization` is 401 with `WWW-Authenticate: Bearer`; a token that is not configured is 403.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated

from fastapi import Depends, Request, WebSocket
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.errors import ApiProblem

# auto_error=False: we answer with our own problem+json; the scheme still shows in /docs.
_bearer = HTTPBearer(auto_error=False, description="A token from `API_TOKEN`")


def token_is_valid(offered: str, tokens: list[str]) -> bool:
    """Constant-time comparison against every configured token.

    Digests first, so the comparison time depends neither on the tokens' lengths nor on which
    token matched.
    """
    offered_digest = hashlib.sha256(offered.encode()).digest()
    matched = False
    for token in tokens:
        matched |= hmac.compare_digest(offered_digest, hashlib.sha256(token.encode()).digest())
    return matched


def require_token(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Dependency for HTTP routes: 401 without a bearer token, 403 with an unknown one."""
    tokens: list[str] = request.app.state.resources.settings.api_tokens
    if not tokens:
        return
    if credentials is None or not credentials.credentials:
        raise ApiProblem(
            401,
            "unauthorized",
            "Unauthorized",
            "send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": 'Bearer realm="durable-outbox"'},
        )
    if not token_is_valid(credentials.credentials, tokens):
        raise ApiProblem(403, "forbidden", "Forbidden", "the bearer token is not valid")


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
