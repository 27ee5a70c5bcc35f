"""Auth, health, readiness, metrics and failure handling of the API."""

from __future__ import annotations

import logging
from typing import Any

import httpx
from durable_outbox_temporal import OutboxClient, TemporalConnection
from durable_outbox_temporal.contract.item import ItemProjection, ItemStatus, OutboxItemView
from durable_outbox_temporal.destinations import DestinationRegistry

from api.main import create_app
from readmodel import store
from readmodel.db import create_schema, make_engine
from tests.api.conftest import api_settings
from tests.api.test_items import assert_problem
from tests.readmodel.test_store import view

STATS = "/v1/outboxes/tests/stats"


async def test_token_required_when_configured(api_factory) -> None:
    api = await api_factory(api_token="s3cret, other")

    missing = await api.http.get(STATS)
    basic = await api.http.get(STATS, headers={"Authorization": "Basic czNjcmV0"})
    empty = await api.http.get(STATS, headers={"Authorization": "Bearer "})
    wrong = await api.http.get(STATS, headers={"Authorization": "Bearer s3cre"})
    first = await api.http.get(STATS, headers={"Authorization": "Bearer s3cret"})
    second = await api.http.get(STATS, headers={"Authorization": "bearer other"})
    enqueue = await api.http.post(
        "/v1/outboxes/tests/items", json={"destination": api.webhook.name, "payload": {}}
    )

    for unauthenticated in (missing, basic, empty, enqueue):
        assert_problem(unauthenticated, 401, "unauthorized")
        assert unauthenticated.headers["www-authenticate"].startswith("Bearer")
    assert api.stack.outbox.started == []
    assert_problem(wrong, 403, "forbidden")
    assert (first.status_code, second.status_code) == (200, 200)
    for open_path in ("/healthz", "/readyz", "/openapi.json"):
        assert (await api.http.get(open_path)).status_code == 200, open_path
    # With tokens configured, a scrape needs one too (METRICS_TOKEN_REQUIRED, on by default).
    assert_problem(await api.http.get("/metrics"), 401, "unauthorized")


async def test_open_api_without_token(api) -> None:
    assert (await api.http.get(STATS)).status_code == 200


async def test_readyz_reports_ready(api) -> None:
    response = await api.http.get("/readyz")

    # In development, without a token or payload keys, it says what is open.
    assert response.status_code == 200 and response.json()["status"] == "ready"


async def test_readyz_is_503_when_database_is_down(api_factory) -> None:
    unreachable = make_engine("postgresql://nobody@127.0.0.1:1/none?connect_timeout=1")
    api = await api_factory(engine=unreachable)

    body = assert_problem(await api.http.get("/readyz"), 503, "not-ready")
    listing = await api.http.get("/v1/outboxes/tests/items")

    assert body["down"] == ["database"] and "database" in body["detail"]
    assert_problem(listing, 503, "database-unavailable")
    assert listing.headers["retry-after"]


async def test_temporal_unreachable_is_503_not_500(tmp_path, fake_provider) -> None:
    settings = api_settings()
    engine = make_engine(f"sqlite:///{tmp_path / 'readmodel.db'}")
    create_schema(engine)
    registry = DestinationRegistry.from_mapping(
        {"down-test": {"provider": "webhook", "settings": {"url": fake_provider.url}}},
        provider_settings=None,
    )
    unreachable = TemporalConnection({"TEMPORAL_ADDRESS": "127.0.0.1:1"})
    app = create_app(settings, temporal_client=unreachable, destinations=registry, engine=engine)
    known = view("known", 3, ItemStatus.SENDING, "tests", destination="down-test")
    store.apply_projection(engine, ItemProjection(view=known, events=[]))

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            enqueue = await http.post(
                "/v1/outboxes/tests/items", json={"destination": "down-test", "payload": {}}
            )
            item = await http.get("/v1/outboxes/tests/items/some-key")
            projected = await http.get("/v1/outboxes/tests/items/known")
            ready = await http.get("/readyz")
            metrics = (await http.get("/metrics")).text

    for response in (enqueue, item):
        assert_problem(response, 503, "temporal-unavailable")
        assert response.headers["retry-after"]
    assert assert_problem(ready, 503, "not-ready")["down"] == ["temporal"]
    assert projected.status_code == 200
    assert projected.json()["status"] == "sending" and projected.json()["source"] == "read-model"
    assert 'destination="down-test",outbox="tests",result="error"} 1.0' in metrics
    engine.dispose()


async def test_injected_temporal_client_is_used(time_skipping_env, engine) -> None:
    app = create_app(
        api_settings(),
        temporal_client=time_skipping_env.client,
        destinations=DestinationRegistry({}),
        engine=engine,
    )

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            ready = await http.get("/readyz")
            unknown = await http.get("/v1/outboxes/tests/items/never-enqueued")

    assert ready.status_code == 200
    assert_problem(unknown, 404, "item-not-found")
    assert await app.state.resources.outbox.temporal() is time_skipping_env.client


class _BrokenClient(OutboxClient):
    async def status(self, outbox: str, key: str) -> OutboxItemView:
        raise KeyError("internal detail that must not leak")


async def test_unexpected_error_is_500_problem_without_internals(
    time_skipping_env, engine, caplog
) -> None:
    broken = _BrokenClient(time_skipping_env.client, DestinationRegistry({}))
    app = create_app(api_settings(), outbox_client=broken, engine=engine)

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            with caplog.at_level(logging.ERROR, logger="outbox.api"):
                response = await http.get("/v1/outboxes/tests/items/k")

    body = assert_problem(response, 500, "internal")
    assert "must not leak" not in response.text and "Traceback" not in response.text
    assert set(body) == {"type", "code", "title", "status", "detail", "instance"}
    assert any("KeyError" in record.getMessage() for record in caplog.records)


async def test_metrics_count_requests_and_enqueues(api) -> None:
    await api.http.post(
        "/v1/outboxes/tests/items", json={"destination": api.webhook.name, "payload": {}}
    )
    await api.http.post("/v1/outboxes/tests/items", json={"destination": "nowhere", "payload": {}})
    await api.http.post(
        "/v1/outboxes/bad name/items", json={"destination": api.webhook.name, "payload": {}}
    )
    await api.http.get("/v1/outboxes/tests/items/k-404")
    await api.http.get("/no/such/route/12345")

    text = (await api.http.get("/metrics")).text

    def sample(name: str, labels: str) -> float:
        prefix = f"{name}{{{labels}}} "
        lines = [line for line in text.splitlines() if line.startswith(prefix)]
        assert lines, f"{prefix!r} not in metrics"
        return float(lines[0].removeprefix(prefix))

    requests = "outbox_http_requests_total"
    assert sample(requests, 'method="POST",route="/v1/outboxes/{outbox}/items",status="202"') == 1
    assert sample(requests, 'method="POST",route="/v1/outboxes/{outbox}/items",status="404"') == 1
    item_route = 'method="GET",route="/v1/outboxes/{outbox}/items/{key}",status="404"'
    assert sample(requests, item_route) == 1
    assert sample(requests, 'method="GET",route="unmatched",status="404"') == 1
    assert "k-404" not in text and "12345" not in text
    duration = "outbox_http_request_duration_seconds_count"
    assert sample(duration, 'method="POST",route="/v1/outboxes/{outbox}/items"') == 3
    enqueued = "outbox_items_enqueued_total"
    assert sample(enqueued, f'destination="{api.webhook.name}",outbox="tests",result="created"')
    # Names nobody configured collapse into one label value, so callers cannot grow the series.
    assert sample(enqueued, 'destination="unknown",outbox="tests",result="rejected"') == 1
    rejected_outbox = f'destination="{api.webhook.name}",outbox="invalid",result="rejected"'
    assert sample(enqueued, rejected_outbox) == 1
    assert "nowhere" not in text and "bad name" not in text


DOCUMENTED_PATHS = [
    "/v1/outboxes/{outbox}/items",
    "/v1/outboxes/{outbox}/items:batch",
    "/v1/outboxes/{outbox}/items:redrive-failed",
    "/v1/outboxes/{outbox}/items/{key}",
    "/v1/outboxes/{outbox}/items/{key}/events",
    "/v1/outboxes/{outbox}/items/{key}/cancel",
    "/v1/outboxes/{outbox}/items/{key}/redrive",
    "/v1/outboxes",
    "/v1/outboxes/{outbox}/stats",
    "/healthz",
    "/readyz",
    "/metrics",
]


async def test_openapi_documents_the_endpoints(api) -> None:
    # One stack and one schema for every path (a case per path built twelve of each).
    spec: dict[str, Any] = (await api.http.get("/openapi.json")).json()

    for path in DOCUMENTED_PATHS:
        assert path in spec["paths"], path
        if path.startswith("/v1"):
            operation = next(iter(spec["paths"][path].values()))
            assert operation["security"] == [{"HTTPBearer": []}], path
            assert "application/problem+json" in operation["responses"]["422"]["content"], path
