"""Regression tests for bad input found by schemathesis: a 4xx problem, never a 500."""

from __future__ import annotations

import pytest

from outbox_client import InvalidRequest, validate_key, validate_ordering_key
from tests.api.conftest import Api
from tests.api.test_items import assert_problem


@pytest.mark.parametrize("field", ["ordering_key", "idempotency_key"])
async def test_lone_surrogates_are_422_not_500(api: Api, field: str) -> None:
    """Found by schemathesis: JSON may escape a lone surrogate that no UTF-8 id can carry."""
    item = f'{{"destination": "{api.webhook.name}", "payload": {{}}, "{field}": "\\ud800"}}'
    body = item if field == "ordering_key" else f'{{"items": [{item}]}}'
    path = "/v1/outboxes/tests/items" + ("" if field == "ordering_key" else ":batch")

    response = await api.http.post(path, content=body, headers={"Content-Type": "application/json"})

    if field == "ordering_key":
        assert_problem(response, 422, "invalid-request")
    else:
        assert response.status_code == 200
        assert response.json()["results"][0]["status"] == 422


@pytest.mark.parametrize("key", [".", "..", "a/b", "", "x" * 1001, "tab\there"])
def test_the_client_refuses_keys_the_api_refuses(key: str) -> None:
    """Callers of OutboxClient (the CLI, other services) get the same rules as the API's."""
    with pytest.raises(InvalidRequest):
        validate_key(key)


async def test_an_ordering_key_cannot_be_combined_with_a_delay(api: Api) -> None:
    """A delayed item would hold up every item behind it in its lane."""
    response = await api.http.post(
        "/v1/outboxes/tests/items",
        json={
            "destination": api.webhook.name,
            "payload": {},
            "ordering_key": "customer-7",
            "delay_seconds": 60,
        },
        headers={"Idempotency-Key": "ordered"},
    )

    assert "cannot be combined with ordering_key" in assert_problem(response, 422)["detail"]
    assert_problem(await api.http.get("/v1/outboxes/tests/items/ordered"), 404)


@pytest.mark.parametrize("key", [".", ".."])
def test_dots_are_refused_as_keys_of_either_kind(key: str) -> None:
    """Both kinds of key are the last segment of a URL (an item's, a lane's)."""
    with pytest.raises(InvalidRequest):
        validate_ordering_key(key)
    with pytest.raises(InvalidRequest):
        validate_key(key)
