"""Bearer tokens with scopes: with any token configured, every `/v1` route (the WebSockets too)
requires one, and the token must carry the route's scope (and, if it names outboxes, the
route's outbox).

Scopes: `read` (every GET, the live streams), `enqueue` (enqueue one or a batch, aggregate
commands), `operate` (everything else that changes something: cancel, redrive, discard, pause,
rates, purge, schedules, effect retries, projector rebuilds). Tokens come from `API_TOKEN` (a
comma-separated list; each one has every scope, for every outbox) and from `API_TOKENS_FILE`, a
TOML file that holds each token's SHA-256 only:

    [tokens.billing-enqueuer]
    sha256 = "<64 hex digits: sha256 of the token>"
    scopes = ["enqueue", "read"]
    outboxes = ["billing"]          # optional: only these outboxes' routes

Open on purpose: `/healthz`, `/readyz` (orchestrators probe without credentials), `/metrics`
(Prometheus scrapes on the internal network; it exposes counts, never payloads), the dashboard
page (static; it asks the user for the token) and the OpenAPI docs. Missing or malformed
`Authorization` is 401 with `WWW-Authenticate: Bearer`; an unknown token is 403, and so is a
token without the route's scope or outbox, saying which.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import tomllib
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, Request, WebSocket
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.errors import ApiProblem
from common.settings import Settings

# auto_error=False: we answer with our own problem+json; the scheme still shows in /docs.
_bearer = HTTPBearer(auto_error=False, description="A token from `API_TOKEN` or `API_TOKENS_FILE`")
_HEX_DIGEST = re.compile(r"^[0-9a-f]{64}$")
# The one route any valid token may call whatever its scopes: what the token itself may do.
TOKEN_ROUTE = "/v1/token"
# Where the Web UI's codec calls go, and the cookie they may authenticate with instead.
CODEC_PATH = "/codec/"
SESSION_COOKIE = "outbox_session"
SESSION_ROUTE = "/v1/token/session"


class Scope(StrEnum):
    READ = "read"
    ENQUEUE = "enqueue"
    OPERATE = "operate"


ALL_SCOPES = frozenset(Scope)


@dataclass(frozen=True)
class ApiToken:
    """One configured token: its name (never the token), digest, scopes and outboxes."""

    name: str
    digest: bytes
    scopes: frozenset[Scope]
    # None: every outbox; otherwise only routes of these outboxes.
    outboxes: frozenset[str] | None = None


def load_tokens(settings: Settings) -> list[ApiToken]:
    """`API_TOKEN`'s tokens (every scope) and `API_TOKENS_FILE`'s; raises ValueError naming what
    is wrong in the file, so a bad file stops the API at start rather than locking users out."""
    tokens = [
        ApiToken(f"API_TOKEN #{n}", _digest(token), ALL_SCOPES)
        for n, token in enumerate(settings.api_tokens, 1)
    ]
    if settings.api_tokens_file:
        tokens += parse_tokens_file(Path(settings.api_tokens_file))
    return tokens


def parse_tokens_file(path: Path) -> list[ApiToken]:
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ValueError(f"API_TOKENS_FILE {path}: {err}") from err
    tables = document.get("tokens")
    if not isinstance(tables, dict) or set(document) != {"tokens"}:
        raise ValueError(f"API_TOKENS_FILE {path}: expected only [tokens.<name>] tables")
    return [_token_from_table(path, name, table) for name, table in tables.items()]


def _token_from_table(path: Path, name: str, table: Any) -> ApiToken:
    where = f"API_TOKENS_FILE {path}: tokens.{name}"
    if not isinstance(table, dict):
        raise ValueError(f"{where}: expected a table")
    unknown = set(table) - {"sha256", "scopes", "outboxes"}
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    digest = table.get("sha256")
    if not isinstance(digest, str) or not _HEX_DIGEST.match(digest.lower()):
        raise ValueError(f"{where}: sha256 must be 64 hex digits (sha256 of the token)")
    scopes = table.get("scopes")
    known = {scope.value for scope in Scope}
    if not isinstance(scopes, list) or not scopes or not set(scopes) <= known:
        raise ValueError(f"{where}: scopes must be a non-empty list of {', '.join(sorted(known))}")
    outboxes = table.get("outboxes")
    if outboxes is not None and (
        not isinstance(outboxes, list)
        or not outboxes
        or not all(isinstance(o, str) and o for o in outboxes)
    ):
        raise ValueError(f"{where}: outboxes must be a non-empty list of outbox names")
    return ApiToken(
        name=name,
        digest=bytes.fromhex(digest),
        scopes=frozenset(Scope(scope) for scope in scopes),
        outboxes=None if outboxes is None else frozenset(outboxes),
    )


def secret_is_valid(offered: str, secret: str) -> bool:
    """Constant-time comparison of a shared secret (a destination's events secret)."""
    return hmac.compare_digest(_digest(offered), _digest(secret))


def matching_token(offered: str, tokens: list[ApiToken]) -> ApiToken | None:
    """The configured token `offered` is, compared in constant time against every one.

    Digests first, so the comparison time depends neither on the tokens' lengths nor on which
    token matched."""
    offered_digest = _digest(offered)
    found = None
    for token in tokens:
        if hmac.compare_digest(offered_digest, token.digest):
            found = token
    return found


def required_scope(method: str, route_path: str) -> Scope | None:
    """The scope a route needs (None: any valid token)."""
    if route_path in (TOKEN_ROUTE, SESSION_ROUTE):
        return None
    if route_path == "/codec/decode":
        return Scope.READ
    if method in ("GET", "HEAD"):
        return Scope.READ
    if method == "POST" and (
        route_path.endswith("/items")
        or route_path.endswith("/items:batch")
        or "/commands/" in route_path
    ):
        return Scope.ENQUEUE
    return Scope.OPERATE


def refusal(token: ApiToken, scope: Scope | None, outbox: str | None) -> str | None:
    """Why `token` may not use a route needing `scope` for `outbox`; None if it may."""
    if scope is not None and scope not in token.scopes:
        held = ", ".join(sorted(token.scopes))
        return f"this token lacks the '{scope}' scope (it has: {held})"
    if token.outboxes is not None and scope is not None:
        allowed = ", ".join(sorted(token.outboxes))
        if outbox is None:
            return f"this token is limited to outboxes {allowed}; this route is not an outbox's"
        if outbox not in token.outboxes:
            return f"this token is not allowed for outbox '{outbox}' (only: {allowed})"
    return None


def require_token(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Dependency for HTTP routes: 401 without a bearer token, 403 with an unknown one or one
    without the route's scope or outbox."""
    tokens: list[ApiToken] = request.app.state.tokens
    if not tokens:
        return
    if (credentials is None or not credentials.credentials) and request.url.path.startswith(
        CODEC_PATH
    ):
        # The Web UI calls the codec server from the browser with cookies only ("include
        # cross-origin credentials"): the session cookie `POST /v1/token/session` set.
        cookie = request.cookies.get(SESSION_COOKIE)
        if cookie:
            credentials = HTTPAuthorizationCredentials(scheme="Bearer", credentials=cookie)
    if credentials is None or not credentials.credentials:
        raise ApiProblem(
            401,
            "unauthorized",
            "Unauthorized",
            "send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": 'Bearer realm="durable-outbox"'},
        )
    token = matching_token(credentials.credentials, tokens)
    if token is None:
        raise ApiProblem(403, "forbidden", "Forbidden", "the bearer token is not valid")
    route = request.scope.get("route")
    scope = required_scope(request.method, getattr(route, "path", request.url.path))
    why = refusal(token, scope, request.path_params.get("outbox"))
    if why is not None:
        raise ApiProblem(403, "forbidden", "Forbidden", why, missing_scope=scope)
    request.state.token = token


def websocket_token_allows(websocket: WebSocket, outbox: str | None) -> bool:
    """A live stream needs `read` (and the outbox, for a limited token). Browsers cannot set
    headers on WebSockets, so `?token=` is accepted there as well."""
    tokens: list[ApiToken] = websocket.app.state.tokens
    if not tokens:
        return True
    header = websocket.headers.get("authorization", "")
    scheme, _, offered = header.partition(" ")
    token = matching_token(offered.strip(), tokens) if scheme.lower() == "bearer" else None
    if token is None:
        token = matching_token(websocket.query_params.get("token", ""), tokens)
    return token is not None and refusal(token, Scope.READ, outbox) is None


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()
