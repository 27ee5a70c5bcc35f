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

Browsers cannot set headers on a WebSocket: a live stream also takes the token as the
subprotocols `bearer` and `bearer.<base64url of the token, unpadded>` (`?token=` still works for
tools, and logs show it as `***`). A browser must also come from the API's own origin or one in
`WEBSOCKET_ORIGINS`. The Temporal Web UI's codec calls carry a cookie of their own instead: a
short-lived value signed with `SESSION_SECRET`, naming the token (never holding it).

Open on purpose: `/healthz`, `/readyz` (orchestrators probe without credentials), the dashboard
page (static; it asks the user for the token) and the OpenAPI docs. `/metrics` needs a token with
the `metrics` scope unless `METRICS_TOKEN_REQUIRED=false` (`api.metrics`). Missing or malformed
`Authorization` is 401 with `WWW-Authenticate: Bearer`; an unknown token is 403, and so is a
token without the route's scope or outbox, saying which.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import time
import tomllib
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import Depends, Request, WebSocket
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.errors import ApiProblem
from configuration.settings import Settings

# auto_error=False: we answer with our own problem+json; the scheme still shows in /docs.
_bearer = HTTPBearer(auto_error=False, description="A token from `API_TOKEN` or `API_TOKENS_FILE`")
_HEX_DIGEST = re.compile(r"^[0-9a-f]{64}$")
# The one route any valid token may call whatever its scopes: what the token itself may do.
TOKEN_ROUTE = "/v1/token"
# Where the Web UI's codec calls go, and the cookie they may authenticate with instead.
CODEC_PATH = "/codec/"
SESSION_COOKIE = "outbox_session"
SESSION_ROUTE = "/v1/token/session"
# How long a codec session cookie is good for; the dashboard renews it each time it loads.
SESSION_TTL_S = 3600
# The WebSocket subprotocol a browser offers to say "my token is in the next one".
BEARER_SUBPROTOCOL = "bearer"
# What `printf %s "$TOKEN" | sha256sum` prints when $TOKEN is unset: never a token.
EMPTY_TOKEN_SHA256 = hashlib.sha256(b"").hexdigest()
# JSON, or a JSON-based type such as application/cloudevents+json.
_JSON_MEDIA_TYPE = re.compile(r"^application/(?:[\w.+-]+\+)?json$")


class Scope(StrEnum):
    READ = "read"
    ENQUEUE = "enqueue"
    OPERATE = "operate"
    # Scraping `/metrics` (a Prometheus token needs nothing else).
    METRICS = "metrics"


ALL_SCOPES = frozenset(Scope)


@dataclass(frozen=True)
class ApiToken:
    """One configured token: its name (never the token), digest, scopes and outboxes."""

    name: str
    digest: bytes
    scopes: frozenset[Scope]
    # None: every outbox; otherwise only routes of these outboxes.
    outboxes: frozenset[str] | None = None
    # The aggregate actors it may act as (`ANY_ACTOR`: anyone); None: its own name only.
    actors: frozenset[str] | None = None


# In a token's `actors`: it may act as any actor (but the service's own).
ANY_ACTOR = "*"


def load_tokens(settings: Settings) -> list[ApiToken]:
    """`API_TOKEN`'s tokens (every scope) and `API_TOKENS_FILE`'s; raises ValueError naming what
    is wrong in the file, so a bad file stops the API at start rather than locking users out."""
    tokens = [
        ApiToken(f"API_TOKEN #{n}", _digest(token), ALL_SCOPES, actors=frozenset({ANY_ACTOR}))
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
    unknown = set(table) - {"sha256", "scopes", "outboxes", "actors"}
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    digest = table.get("sha256")
    if not isinstance(digest, str) or not _HEX_DIGEST.match(digest.lower()):
        raise ValueError(f"{where}: sha256 must be 64 hex digits (sha256 of the token)")
    if digest.lower() == EMPTY_TOKEN_SHA256:
        raise ValueError(f"{where}: sha256 is the digest of an empty token (was $TOKEN unset?)")
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
    actors = table.get("actors")
    if actors is not None and (
        not isinstance(actors, list)
        or not actors
        or not all(isinstance(a, str) and a for a in actors)
    ):
        raise ValueError(f'{where}: actors must be a non-empty list of actor names, or ["*"]')
    return ApiToken(
        name=name,
        digest=bytes.fromhex(digest),
        scopes=frozenset(Scope(scope) for scope in scopes),
        outboxes=None if outboxes is None else frozenset(outboxes),
        actors=None if actors is None else frozenset(actors),
    )


def secret_is_valid(offered: str, secret: str) -> bool:
    """Constant-time comparison of a shared secret (a destination's events secret)."""
    return hmac.compare_digest(_digest(offered), _digest(secret))


def matching_token(offered: str, tokens: list[ApiToken]) -> ApiToken | None:
    """The configured token `offered` is, compared in constant time against every one.

    Digests first, so the comparison time depends neither on the tokens' lengths nor on which
    token matched."""
    if not offered:
        return None
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


async def require_token(
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
        session = request.cookies.get(SESSION_COOKIE)
        if session:
            by_session = session_token(session, tokens, request.app.state.session_key)
            if by_session is None:
                raise ApiProblem(
                    403, "forbidden", "Forbidden", "the codec session has expired or is not valid"
                )
            _authorise(request, by_session)
            return
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
    _authorise(request, token)


def _authorise(request: Request, token: ApiToken) -> None:
    route = request.scope.get("route")
    scope = required_scope(request.method, getattr(route, "path", request.url.path))
    why = refusal(token, scope, request.path_params.get("outbox"))
    if why is not None:
        raise ApiProblem(403, "forbidden", "Forbidden", why, missing_scope=scope)
    request.state.token = token


async def require_json(request: Request) -> None:
    """Dependency for state-changing routes: a POST, and a PUT, PATCH or DELETE with a body, must
    say `Content-Type: application/json`. An HTML form or a "simple" cross-site fetch cannot, so
    no other site's page can make a browser change anything here (the API open or not)."""
    if request.method not in ("POST", "PUT", "PATCH", "DELETE"):
        return
    if request.method != "POST" and not _has_body(request):
        return
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if not _JSON_MEDIA_TYPE.match(media_type):
        raise ApiProblem(
            415,
            "unsupported-media-type",
            "Unsupported media type",
            "a POST (and a PUT, PATCH or DELETE with a body) must send"
            " 'Content-Type: application/json'",
        )


def _has_body(request: Request) -> bool:
    if "transfer-encoding" in request.headers:
        return True
    try:
        return int(request.headers.get("content-length") or 0) > 0
    except ValueError:
        return True


def session_value(token: ApiToken, key: bytes, now: float | None = None) -> str:
    """A codec session cookie for `token`: its name and an expiry, signed with `key` over the
    token's digest too, so it ends when the token is removed or replaced. Any API process with
    the same `SESSION_SECRET` accepts it."""
    expires = int((time.time() if now is None else now) + SESSION_TTL_S)
    claim = f"{_b64(token.name.encode())}.{expires}"
    return f"{claim}.{_b64(_session_mac(key, claim, token))}"


def session_token(
    value: str, tokens: list[ApiToken], key: bytes, now: float | None = None
) -> ApiToken | None:
    """The token a codec session cookie stands for, if it is genuine and has not expired."""
    claim, _, signature = value.rpartition(".")
    encoded_name, _, expires = claim.partition(".")
    try:
        name = _unb64(encoded_name).decode()
        mac = _unb64(signature)
        expired = int(expires) < (time.time() if now is None else now)
    except (ValueError, UnicodeDecodeError):
        return None
    found = None
    for token in tokens:
        if token.name == name and hmac.compare_digest(mac, _session_mac(key, claim, token)):
            found = token
    return None if expired else found


def _session_mac(key: bytes, claim: str, token: ApiToken) -> bytes:
    return hmac.new(key, f"{claim}.{token.digest.hex()}".encode(), hashlib.sha256).digest()


def websocket_refusal(websocket: WebSocket, outbox: str | None, origins: list[str]) -> str | None:
    """Why a live stream may not open (None: it may): a browser page from another origin than
    the API's or `origins`; without a token with `read` (and the outbox, for a limited one)."""
    origin = websocket.headers.get("origin")
    if origin is not None and not _origin_allowed(origin, websocket.headers.get("host"), origins):
        return f"origin {origin!r} may not open this stream"
    if not websocket.app.state.tokens:
        return None
    token = websocket_token(websocket)
    if token is None:
        return "invalid or missing token"
    return refusal(token, Scope.READ, outbox)


def websocket_token(websocket: WebSocket) -> ApiToken | None:
    """The configured token a socket's handshake carries (header, subprotocol or `?token=`)."""
    tokens: list[ApiToken] = websocket.app.state.tokens
    token = None
    for offered in _websocket_credentials(websocket):
        token = token or matching_token(offered, tokens)
    return token


def websocket_subprotocol(websocket: WebSocket) -> str | None:
    """The subprotocol to accept with: `bearer` when the client offered it (a browser that
    offers subprotocols fails the handshake if none is chosen); the token's never echoes back."""
    offered = websocket.scope.get("subprotocols", [])
    return BEARER_SUBPROTOCOL if BEARER_SUBPROTOCOL in offered else None


def _websocket_credentials(websocket: WebSocket) -> list[str]:
    offered = []
    scheme, _, header_token = websocket.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        offered.append(header_token.strip())
    for subprotocol in websocket.scope.get("subprotocols", []):
        if subprotocol.startswith(f"{BEARER_SUBPROTOCOL}."):
            try:
                offered.append(_unb64(subprotocol.removeprefix(f"{BEARER_SUBPROTOCOL}.")).decode())
            except (ValueError, UnicodeDecodeError):
                continue
    offered.append(websocket.query_params.get("token", ""))
    return [credential for credential in offered if credential]


def _origin_allowed(origin: str, host: str | None, origins: list[str]) -> bool:
    if origin.rstrip("/") in origins:
        return True
    return host is not None and urlsplit(origin).netloc.lower() == host.lower()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except binascii.Error as err:
        raise ValueError(str(err)) from err


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()
