"""The real FastAPI app, driven in-process over ASGI, on top of a real Temporal stack."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import pytest_asyncio
from durable_outbox_temporal.destinations import Destination
from temporalio.testing import WorkflowEnvironment

from api.main import create_app
from configuration.settings import Settings
from devstack.serving import serve_in_background
from tests.conftest import Stack, email_destination, webhook_destination
from worker import default_operations_task_queue


async def json_client(request: httpx.Request) -> None:
    """Say JSON on a body-less POST, as the dashboard and the CLI do: the API refuses a POST
    without `Content-Type: application/json` (415), so no HTML form can send one. A request
    with a body keeps the type it was given (or none), which tests of the 415 rely on."""
    body_less = request.headers.get("content-length", "0") == "0"
    streamed = "transfer-encoding" in request.headers
    if request.method == "POST" and body_less and not streamed:
        request.headers.setdefault("Content-Type", "application/json")


@dataclass
class Api:
    """An HTTP client on the app plus the stack behind it."""

    http: httpx.AsyncClient
    stack: Stack
    email: Destination
    webhook: Destination


def api_settings(**overrides: Any) -> Settings:
    return Settings(_env_file=None, **overrides)  # type: ignore[call-arg]


async def open_api(
    stack: Stack, settings: Settings, **app_kwargs: Any
) -> AsyncIterator[httpx.AsyncClient]:
    # The stack's tracking client, so teardown terminates items the API started.
    stack.outbox.task_queue = settings.workflow_task_queue
    app = create_app(
        settings, outbox_client=stack.outbox, engine=app_kwargs.pop("engine", stack.engine)
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://api", event_hooks={"request": [json_client]}
        ) as http:
            yield http


@contextlib.asynccontextmanager
async def serve_stack(stack: Stack, **settings_overrides: Any) -> AsyncIterator[str]:
    """The real app over `stack` on a loopback port (its lifespan on); yields its base URL."""
    settings_overrides.setdefault(
        "operations_task_queue", default_operations_task_queue(stack.task_queue)
    )
    settings = api_settings(workflow_task_queue=stack.task_queue, **settings_overrides)
    app = create_app(settings, outbox_client=stack.outbox, engine=stack.engine)
    async with serve_in_background(app, lifespan="on") as url:
        yield url


@pytest_asyncio.fixture(loop_scope="session")
async def api_factory(stack_factory, fake_provider) -> AsyncIterator[Callable[..., Any]]:
    """Build an Api with given settings (token, size limit, engine) over a fresh stack."""
    opened: list[Any] = []

    async def build(
        email_overrides: dict[str, Any] | None = None,
        env: WorkflowEnvironment | None = None,
        **settings_overrides: Any,
    ) -> Api:
        email = email_destination(fake_provider, **(email_overrides or {}))
        webhook = webhook_destination(fake_provider)
        stack = await stack_factory(email, webhook, env=env)
        engine = settings_overrides.pop("engine", stack.engine)
        # The stack's own operations worker runs redrive batches and scheduled fires.
        settings_overrides.setdefault(
            "operations_task_queue", default_operations_task_queue(stack.task_queue)
        )
        settings = api_settings(workflow_task_queue=stack.task_queue, **settings_overrides)
        generator = open_api(stack, settings, engine=engine)
        http = await generator.__anext__()
        opened.append(generator)
        return Api(http=http, stack=stack, email=email, webhook=webhook)

    yield build
    for generator in opened:
        await generator.aclose()


@pytest_asyncio.fixture(loop_scope="session")
async def api(api_factory) -> Api:
    return await api_factory()


@dataclass
class ServedApi:
    """The app on a real loopback port (for WebSockets and the browser), plus its stack."""

    url: str
    stack: Stack
    webhook: Destination


@pytest_asyncio.fixture(loop_scope="session")
async def served_api_factory(stack_factory, fake_provider) -> AsyncIterator[Callable[..., Any]]:
    async with contextlib.AsyncExitStack() as servers:

        async def build(
            env: WorkflowEnvironment | None = None,
            destinations: Sequence[Destination] = (),
            **settings_overrides: Any,
        ) -> ServedApi:
            """`destinations` go beside the stack's own webhook (`ServedApi.webhook`)."""
            webhook = webhook_destination(fake_provider)
            stack = await stack_factory(webhook, *destinations, env=env)
            settings_overrides.setdefault(
                "operations_task_queue", default_operations_task_queue(stack.task_queue)
            )
            settings = api_settings(workflow_task_queue=stack.task_queue, **settings_overrides)
            app = create_app(settings, outbox_client=stack.outbox, engine=stack.engine)
            url = await servers.enter_async_context(serve_in_background(app, lifespan="on"))
            return ServedApi(url=url, stack=stack, webhook=webhook)

        yield build


async def read_destination(http: httpx.AsyncClient, url: str) -> Any:
    """`GET /v1/destinations/{name}` (`url`) as a client reads it under load: a 503 (Temporal's
    describe timed out, with Retry-After) is read again, a moment later, up to 10 s."""
    for _ in range(100):
        answer = await http.get(url)
        if answer.status_code != 503:
            assert answer.status_code == 200, answer.text
            return answer.json()
        await asyncio.sleep(0.1)
    raise AssertionError(f"{url} answered 503 for 10 s: {answer.text}")
