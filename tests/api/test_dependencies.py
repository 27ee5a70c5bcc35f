"""The API's request dependencies run on the event loop: FastAPI runs a plain `def` dependency in
its thread pool, a thread hand-off per dependency and request
(docs/decisions/async-dependencies.md)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

from fastapi.dependencies.models import Dependant
from fastapi.dependencies.utils import get_dependant
from fastapi.routing import APIRoute, APIWebSocketRoute
from starlette.routing import BaseRoute

from api.main import _routes


def _calls(dependant: Dependant) -> Iterator[Any]:
    for dependency in dependant.dependencies:
        yield dependency.call
        yield from _calls(dependency)


def _route_calls(routes: Any) -> Iterator[tuple[BaseRoute, Any]]:
    """Each route with each dependency it runs: its own, its router's, and those its router was
    included with (FastAPI prepares an included route lazily, so they are gathered here)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            included = [
                call
                for depends in route.include_context.dependencies
                for call in (
                    depends.dependency,
                    *_calls(get_dependant(path="", call=depends.dependency)),
                )
            ]
            for found, call in _route_calls(inner.routes):
                yield found, call
                if call is None:  # once per route
                    yield from ((found, c) for c in included)
        elif isinstance(route, APIRoute | APIWebSocketRoute):
            yield route, None
            yield from ((route, call) for call in _calls(route.dependant))


def _runs_on_the_loop(call: Any) -> bool:
    return inspect.iscoroutinefunction(call) or inspect.iscoroutinefunction(
        getattr(call, "__call__", None)  # noqa: B004 - a dependency instance (HTTPBearer)
    )


def test_every_dependency_of_every_route_is_async() -> None:
    found = list(_route_calls(_routes()))
    assert len({id(route) for route, _ in found}) > 50
    assert any(call is not None and "require_token" in call.__name__ for _, call in found)
    sync = {
        f"{call.__module__}.{getattr(call, '__qualname__', type(call).__name__)}"
        for _, call in found
        if call is not None and not _runs_on_the_loop(call)
    }
    assert not sync, f"plain `def` dependencies, each run in the thread pool: {sorted(sync)}"
