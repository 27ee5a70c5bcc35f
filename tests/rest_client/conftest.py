"""The REST client against the real API: the app served by uvicorn on a loopback port, over a
stack on the Temporal dev server, as a service would call it. The sync client blocks, so its
calls run in a thread while the app serves in the test's event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest_asyncio
from durable_outbox_temporal.destinations import Destination

from tests.api.conftest import serve_stack
from tests.conftest import Stack, email_destination, webhook_destination


@dataclass
class ServedStack:
    """The API's base URL, its stack and the stack's two destinations at the fake provider."""

    url: str
    stack: Stack
    email: Destination
    webhook: Destination


@pytest_asyncio.fixture(loop_scope="session")
async def served(stack_factory, fake_provider, dev_env) -> AsyncIterator[ServedStack]:
    email = email_destination(fake_provider)
    webhook = webhook_destination(fake_provider)
    stack = await stack_factory(email, webhook, env=dev_env)
    async with serve_stack(stack) as url:
        yield ServedStack(url=url, stack=stack, email=email, webhook=webhook)
