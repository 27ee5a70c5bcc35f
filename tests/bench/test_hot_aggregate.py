"""The hot aggregate scenario retries a 503 as a caller would, and nothing else."""

from __future__ import annotations

import httpx
import pytest

from bench.hot_aggregate import TRIES_ON_503, answered


def client_answering(*statuses: int) -> tuple[httpx.AsyncClient, list[int]]:
    """A client whose requests get `statuses` in turn (the last one from then on); the
    statuses given so far."""
    given: list[int] = []

    def handle(request: httpx.Request) -> httpx.Response:
        status = statuses[min(len(given), len(statuses) - 1)]
        given.append(status)
        return httpx.Response(status, headers={"Retry-After": "0"}, json={"version": 1})

    return httpx.AsyncClient(transport=httpx.MockTransport(handle)), given


async def test_a_503_is_asked_again_after_its_retry_after() -> None:
    http, given = client_answering(503, 503, 200)
    async with http:
        response = await answered(lambda: http.get("http://api/v1/aggregates/flight/f"))
    assert response.json() == {"version": 1}
    assert given == [503, 503, 200]


async def test_a_503_that_lasts_raises_after_the_tries() -> None:
    http, given = client_answering(503)
    async with http:
        with pytest.raises(httpx.HTTPStatusError):
            await answered(lambda: http.get("http://api/v1/aggregates/flight/f"))
    assert given == [503] * TRIES_ON_503


async def test_another_error_raises_at_once() -> None:
    http, given = client_answering(409)
    async with http:
        with pytest.raises(httpx.HTTPStatusError):
            await answered(lambda: http.post("http://api/v1/aggregates/flight/f/commands/open"))
    assert given == [409]
