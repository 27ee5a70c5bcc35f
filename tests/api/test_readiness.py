"""`/readyz` tells the truth about the Temporal namespace and the read model: a namespace without
the product's search attributes would refuse every item's start, and a schema behind the release
would fail its queries, so the API is not ready and says which are missing or which revision it
is at (the API and the worker log the same at start, each tested here). A missing table is a
problem naming it, never "retry later"."""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
from durable_outbox_temporal.connection import (
    missing_search_attributes,
    missing_search_attributes_message,
)
from durable_outbox_temporal.contract import search_attributes
from durable_outbox_temporal.destinations import DestinationRegistry
from google.protobuf.duration_pb2 import Duration
from sqlalchemy import text
from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest
from temporalio.client import Client
from temporalio.service import RPCError

from activities import worker_startup
from api.main import create_app
from configuration.settings import Settings
from tests.api.conftest import api_settings
from tests.api.test_items import assert_problem
from tests.conftest import SEED_TYPES, register_search_attributes, unique_name

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


async def test_readyz_and_the_log_name_a_schema_behind_this_release(
    dev_env, engine, caplog
) -> None:
    app = create_app(
        api_settings(),
        temporal_client=dev_env.client,
        destinations=DestinationRegistry({}),
        engine=engine,
    )

    async with app.router.lifespan_context(app):
        # A rollback's migrations, or a database the API may not migrate: an older revision.
        with engine.begin() as connection:
            connection.execute(
                text(
                    "UPDATE alembic_version SET version_num = '0017'"
                    " WHERE version_num NOT LIKE 'labour%'"
                )
            )
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            with caplog.at_level(logging.ERROR, logger="outbox.api"):
                behind = await http.get("/readyz")

    body = assert_problem(behind, 503, "not-ready")
    assert body["down"] == ["schema"]
    assert "at revision 0017" in body["detail"] and "`alembic upgrade heads`" in body["detail"]
    assert any(body["detail"] in record.getMessage() for record in caplog.records)


async def test_a_missing_table_is_a_schema_problem_naming_it_not_retry_later(
    dev_env, engine
) -> None:
    app = create_app(
        api_settings(),
        temporal_client=dev_env.client,
        destinations=DestinationRegistry({}),
        engine=engine,
    )

    async with app.router.lifespan_context(app):
        with engine.begin() as connection:
            connection.execute(text("DROP TABLE outbox_items"))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            listed = await http.get("/v1/outboxes")

    body = assert_problem(listed, 503, "schema-not-at-head")
    assert body["missing"] == 'table "outbox_items"'
    assert "`alembic upgrade heads`" in body["detail"] and "retry" not in body["detail"]
    assert "Retry-After" not in listed.headers


async def test_the_api_logs_missing_search_attributes_at_start(dev_env, engine, caplog) -> None:
    client = await new_namespace(dev_env)
    app = create_app(
        api_settings(), temporal_client=client, destinations=DestinationRegistry({}), engine=engine
    )

    with caplog.at_level(logging.ERROR, logger="outbox.api"):
        async with app.router.lifespan_context(app):
            deadline = time.monotonic() + 10
            while not any("lacks the search attributes" in r.getMessage() for r in caplog.records):
                assert time.monotonic() < deadline, "nothing logged at start"
                await asyncio.sleep(0.05)

    logged = [r.getMessage() for r in caplog.records if "lacks the search" in r.getMessage()]
    assert logged == [missing_search_attributes_message(ALL_NAMES)]


async def test_the_worker_logs_missing_search_attributes_at_start(
    dev_env, caplog, monkeypatch
) -> None:
    client = await new_namespace(dev_env)
    monkeypatch.setenv("TEMPORAL_ADDRESS", client.service_client.config.target_host)
    monkeypatch.setenv("TEMPORAL_NAMESPACE", client.namespace)

    with caplog.at_level(logging.ERROR, logger=worker_startup.log.name):
        await worker_startup.connect_worker(Settings(), None, None, None)

    logged = [r.getMessage() for r in caplog.records if "lacks the search" in r.getMessage()]
    assert logged == [missing_search_attributes_message(ALL_NAMES)]


def test_an_activities_only_worker_logs_a_schema_behind_this_release(engine, caplog) -> None:
    # A worker that runs workflows migrates the schema itself; one that runs activities only
    # leaves that to others, and says (as `/readyz` does) when it is behind.
    with engine.begin() as connection:
        connection.execute(
            text(
                "UPDATE alembic_version SET version_num = '0017'"
                " WHERE version_num NOT LIKE 'labour%'"
            )
        )

    settings = Settings(database_url=engine.url.render_as_string(), claim_check_bytes=0)

    with caplog.at_level(logging.ERROR, logger=worker_startup.log.name):
        databases = worker_startup.WorkerDatabases.open(settings, None, SEED_TYPES.migrations, None)
    databases.ledger.dispose()

    assert any("at revision 0017" in r.getMessage() for r in caplog.records)
