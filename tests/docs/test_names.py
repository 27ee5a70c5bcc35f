"""Every API route and environment variable the docs name in code spans exists: a route of the
app (or a prefix of its routes), a variable the settings read or the code, the compose file or
the Makefile uses, or one of another program's that the docs tell you to set."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.routing import APIRoute, APIWebSocketRoute
from starlette.routing import Mount

from api.main import create_app
from configuration.settings import PROJECT_ROOT, Settings
from tests.docs.test_links import _outside_code_blocks
from tests.docs.test_paths import SOURCE_ROOTS, pages

_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_ENV = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")
_ROUTE = re.compile(r"(?:(GET|POST|PUT|PATCH|DELETE|WS) )?(/[\w{}./:*-]*)(?:\?\S*)?")
# The API's own namespaces: other paths in the docs are the fake provider's or an example's.
_API_PREFIXES = ("/v1", "/codec", "/healthz", "/readyz", "/metrics", "/problems", "/docs")
# Other programs' variables the docs tell an operator to set: uvicorn's, the Temporal server's
# and its Web UI's.
OTHER_PROGRAMS = {
    "FORWARDED_ALLOW_IPS",
    "TEMPORAL_AUTH_ENABLED",
    "TEMPORAL_AUTH_CALLBACK_URL",
    "TEMPORAL_AUTH_CLIENT_ID",
    "TEMPORAL_AUTH_CLIENT_SECRET",
    "TEMPORAL_AUTH_PROVIDER_URL",
    "TEMPORAL_TLS_CA",
    "TEMPORAL_TLS_CERT",
    "TEMPORAL_TLS_KEY",
    "TEMPORAL_TLS_CLIENT1_CA_CERT",
    "TEMPORAL_TLS_FRONTEND_CERT",
    "TEMPORAL_TLS_FRONTEND_KEY",
    "TEMPORAL_TLS_REQUIRE_CLIENT_AUTH",
}


def code_spans(page: Path) -> list[str]:
    return [
        match.group(1).strip()
        for line in _outside_code_blocks(page.read_text())
        for match in _CODE_SPAN.finditer(line)
    ]


def app_routes() -> list[tuple[re.Pattern[str], set[str]]]:
    found: list[tuple[re.Pattern[str], set[str]]] = []

    def walk(routes: list[object], prefix: str) -> None:
        for route in routes:
            inner = getattr(route, "original_router", None)
            if inner is not None:
                walk(inner.routes, prefix + route.include_context.prefix)  # type: ignore[attr-defined]
            elif isinstance(route, APIRoute | APIWebSocketRoute) or hasattr(route, "path"):
                path = prefix + route.path  # type: ignore[attr-defined]
                parts = re.split(r"(\{[^}]+\})", path)
                pattern = "".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts)
                methods = getattr(route, "methods", None) or {"WS"}
                # A mount (static files) serves every path below it.
                below = "(?:/.*)?" if isinstance(route, Mount) else "(/.*)?"
                found.append((re.compile(f"^{pattern}{below}$"), set(methods)))

    walk(create_app().routes, "")
    return found


ROUTES = app_routes()


def route_exists(method: str | None, path: str) -> bool:
    concrete = re.sub(r"\{[^}]+\}", "x", path.rstrip("/")) or "/"
    for pattern, methods in ROUTES:
        match = pattern.match(concrete)
        below = match.groups()[0] if match and match.groups() else None
        if match and below is None and (method is None or method in methods):
            return True
    # A prefix (`/v1`, `/codec/`) names the routes under it.
    return method is None and any(
        pattern.pattern.startswith(f"^{re.escape(concrete)}/") for pattern, _ in ROUTES
    )


def known_variables() -> set[str]:
    read = {name.upper() for name in Settings.model_fields}
    # Constants the docs name (`OLDEST_OPEN_RELEASE`) count too, wherever the code keeps them.
    code = [path for root in SOURCE_ROOTS for path in (PROJECT_ROOT / root).rglob("*.py")]
    sources = [
        *code,
        PROJECT_ROOT / "worker.py",
        PROJECT_ROOT / "cli.py",
        PROJECT_ROOT / "Makefile",
    ]
    sources += [*PROJECT_ROOT.glob("*.yml")]
    used = set().union(*(set(_ENV.findall(path.read_text())) for path in sources))
    used |= set(_ENV.findall((PROJECT_ROOT / "config" / "destinations.toml").read_text()))
    return read | used | OTHER_PROGRAMS


VARIABLES = known_variables()


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(PROJECT_ROOT)))
def test_every_route_and_variable_named_exists(page: Path) -> None:
    unknown = []
    for span in code_spans(page):
        route = _ROUTE.fullmatch(span)
        if route and route.group(2).startswith(_API_PREFIXES):
            if not route_exists(route.group(1), route.group(2)):
                unknown.append(span)
        elif _ENV.fullmatch(span) and span not in VARIABLES:
            unknown.append(span)
    assert unknown == []


def test_the_check_sees_a_missing_route_and_variable() -> None:
    assert route_exists("POST", "/v1/outboxes/{outbox}/items")
    assert route_exists(None, "/v1")
    assert not route_exists("DELETE", "/v1/outboxes/{outbox}/items")
    assert not route_exists(None, "/v1/outboxes/{outbox}/nothing-here")
    # Built here, so this file does not name it whole.
    assert "DATABASE_URL" in VARIABLES and "NO_SUCH_" + "SETTING" not in VARIABLES
