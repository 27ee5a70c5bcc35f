"""The API's production shape: the start-up check that refuses an open configuration in
production, the host check, CORS for the codec server only, and the headers that tell a browser
what a page may load (README, Security)."""

from __future__ import annotations

import logging

from durable_outbox_temporal.codec import EncryptionCodec
from durable_outbox_temporal.destinations import DestinationRegistry
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.auth import CODEC_PATH, ApiToken
from api.errors import ApiProblem, problem_response
from configuration.production import open_payloads, public_credentials, refuse_open_production
from configuration.settings import Settings

log = logging.getLogger("outbox.api")


def open_configuration(
    tokens: list[ApiToken], codec: EncryptionCodec | None, destinations: DestinationRegistry
) -> list[str]:
    """What leaves this API open to whoever reaches it; empty when nothing does."""
    reasons = []
    if not tokens:
        reasons.append("no API token (API_TOKEN or API_TOKENS_FILE): anyone may call the API")
    return reasons + open_payloads(codec) + public_credentials(destinations)


class AllowedHosts:
    """Starlette's TrustedHostMiddleware rule (`example.com`, `*.example.com`, `*`) answering a
    request for another host name with a 400 problem, not plain text: a page on a rebound DNS
    name cannot reach the API through a browser."""

    def __init__(self, app: ASGIApp, allowed_hosts: list[str]) -> None:
        self.app = app
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and "*" not in self.allowed_hosts:
            host = Headers(scope=scope).get("host", "").split(":")[0].lower()
            if not any(self._matches(host, pattern) for pattern in self.allowed_hosts):
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008, "reason": "host"})
                    return
                problem = ApiProblem(
                    400, "invalid-host", "Invalid host", f"host {host!r} is not served here"
                )
                await problem_response(Request(scope), problem)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    @staticmethod
    def _matches(host: str, pattern: str) -> bool:
        pattern = pattern.lower()
        if pattern.startswith("*."):
            return host.endswith(pattern[1:])
        return host == pattern


# The dashboard's pages (and every other answer): the API's own scripts, styles and connections
# (its live sockets included) only; no inline script or style, no plugin, never in a frame.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
    " connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self';"
    " frame-ancestors 'none'"
)
# Swagger UI and Redoc style their elements inline as they render, and Redoc searches in a
# worker it starts from a blob: scripts stay the API's own files.
DOCS_CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline';"
    " img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; connect-src 'self';"
    " object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
_DOCS_PAGES = ("/docs", "/redoc")
_SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    # For browsers without frame-ancestors.
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
]


class SecurityHeaders:
    """`Content-Security-Policy`, `X-Content-Type-Options: nosniff`, `X-Frame-Options: DENY` and
    `Referrer-Policy: no-referrer` on every HTTP answer that does not set its own."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"].removeprefix(str(scope.get("root_path", "")).rstrip("/"))
        policy = DOCS_CONTENT_SECURITY_POLICY if path in _DOCS_PAGES else CONTENT_SECURITY_POLICY
        added = [(b"content-security-policy", policy.encode()), *_SECURITY_HEADERS]

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [(name, value) for name, value in added if name not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


class CodecCors:
    """CORS (with credentials) for the codec server's routes only: the Web UI's origin may call
    `/codec/`, and no other route answers its preflights."""

    def __init__(self, app: ASGIApp, origins: list[str]) -> None:
        self.app = app
        self.cors = CORSMiddleware(
            app,
            allow_origins=origins,
            allow_methods=["POST", "OPTIONS"],
            allow_headers=["content-type", "authorization", "x-namespace", "caller-type"],
            allow_credentials=True,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(CODEC_PATH):
            await self.cors(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def check_configuration(
    app: FastAPI, settings: Settings, destinations: DestinationRegistry
) -> None:
    """Refuse to start a production API with an open configuration unless `ALLOW_INSECURE`; say
    what is open on every start, and keep it for `/readyz` (in development too). An open
    `/metrics` (`METRICS_TOKEN_REQUIRED=false` with tokens) is a choice made explicitly: it does
    not stop a start, and is listed all the same."""
    reasons = open_configuration(app.state.tokens, app.state.codec, destinations)
    chosen = []
    if app.state.tokens:
        log.info("API requires a bearer token (%d configured)", len(app.state.tokens))
        if not settings.metrics_token_required:
            chosen.append("METRICS_TOKEN_REQUIRED=false: /metrics answers without a token")
    refuse_open_production("API", settings, reasons)
    for reason in reasons + chosen:
        log.warning("INSECURE: %s", reason)
    app.state.insecure = reasons + chosen
