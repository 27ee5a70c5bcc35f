"""Auth, health, readiness and metrics of the API."""

from __future__ import annotations

from readmodel.db import make_engine
from tests.api.test_items import assert_problem


async def test_token_required_when_configured(api_factory) -> None:
    api = await api_factory(api_token="s3cret,other")
    url = "/v1/outboxes/tests/stats"

    missing = await api.http.get(url)
    wrong = await api.http.get(url, headers={"Authorization": "Bearer nope"})
    right = await api.http.get(url, headers={"Authorization": "Bearer other"})
    health = await api.http.get("/healthz")

    assert_problem(missing, 401)
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert_problem(wrong, 403)
    assert right.status_code == 200
    assert health.status_code == 200


async def test_open_api_without_token(api) -> None:
    assert (await api.http.get("/v1/outboxes/tests/stats")).status_code == 200


async def test_readyz_reports_ready(api) -> None:
    response = await api.http.get("/readyz")

    assert response.status_code == 200 and response.json() == {"status": "ready"}


async def test_readyz_is_503_when_database_is_down(api_factory) -> None:
    unreachable = make_engine("postgresql://nobody@127.0.0.1:1/none?connect_timeout=1")
    api = await api_factory(engine=unreachable)

    body = assert_problem(await api.http.get("/readyz"), 503)

    assert "database" in body["detail"] and "temporal" not in body["detail"]


async def test_metrics_count_requests_and_enqueues(api) -> None:
    await api.http.post(
        "/v1/outboxes/tests/items", json={"destination": api.webhook.name, "payload": {}}
    )
    await api.http.post("/v1/outboxes/tests/items", json={"destination": "nowhere", "payload": {}})

    text = (await api.http.get("/metrics")).text

    assert (
        'outbox_http_requests_total{method="POST",route="/v1/outboxes/{outbox}/items",status="202"}'
        in text
    )
    created = f'destination="{api.webhook.name}",outbox="tests",result="created"'
    assert f"outbox_items_enqueued_total{{{created}}} 1.0" in text
    assert (
        'outbox_items_enqueued_total{destination="nowhere",outbox="tests",result="rejected"} 1.0'
        in text
    )


async def test_openapi_documents_the_endpoints(api) -> None:
    paths = (await api.http.get("/openapi.json")).json()["paths"]

    assert "/v1/outboxes/{outbox}/items" in paths
    assert "/v1/outboxes/{outbox}/items:batch" in paths
    assert "/v1/outboxes/{outbox}/items/{key}/cancel" in paths
