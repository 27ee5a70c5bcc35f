"""`/readyz` tells the truth about the Temporal namespace: a namespace without the product's
search attributes would refuse every item's start, so the API is not ready and says which are
missing (the worker logs the same at start)."""

from __future__ import annotations

import asyncio
import time

import httpx
from durable_outbox_temporal.connection import missing_search_attributes
from durable_outbox_temporal.contract import search_attributes
from durable_outbox_temporal.destinations import DestinationRegistry
from google.protobuf.duration_pb2 import Duration
from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest
from temporalio.client import Client
from temporalio.service import RPCError

from api.main import create_app
from tests.api.conftest import api_settings
from tests.api.test_items import assert_problem
from tests.conftest import register_search_attributes, unique_name

ALL_NAMES = [key.name for key in search_attributes.ALL]


async def new_namespace(dev_env) -> Client:
    """A namespace of its own on the dev server, with no custom search attributes yet."""
    namespace = unique_name("bare")
    await dev_env.client.workflow_service.register_namespace(
        RegisterNamespaceRequest(
            namespace=namespace, workflow_execution_retention_period=Duration(seconds=86_400)
        )
    )
    client = await Client.connect(
        dev_env.client.service_client.config.target_host, namespace=namespace
    )
    deadline = time.monotonic() + 30
    while True:  # the server learns of a new namespace within its refresh interval
        try:
            await missing_search_attributes(client)
            return client
        except RPCError:
            assert time.monotonic() < deadline, "the new namespace never became usable"
            await asyncio.sleep(0.5)


async def test_readyz_names_the_search_attributes_the_namespace_lacks(dev_env, engine) -> None:
    client = await new_namespace(dev_env)
    app = create_app(
        api_settings(), temporal_client=client, destinations=DestinationRegistry({}), engine=engine
    )

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            bare = await http.get("/readyz")
            await register_search_attributes(client)
            registered = await http.get("/readyz")

    body = assert_problem(bare, 503, "not-ready")
    assert body["down"] == ["search_attributes"]
    assert body["missing_search_attributes"] == ALL_NAMES
    assert all(name in body["detail"] for name in ALL_NAMES)
    assert registered.status_code == 200 and registered.json()["status"] == "ready"


async def test_the_stacks_namespace_has_every_search_attribute(dev_env) -> None:
    assert await missing_search_attributes(dev_env.client) == []
