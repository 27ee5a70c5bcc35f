"""Purge as a batch on the dev server (a purge lists items through visibility): `items:purge`
answers 202 at once with the batch, its status URL shows the progress and the end; a batch
whose pages cannot run ends failed with the reason (a page's own rules:
`tests/activities/test_purge.py`)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
from durable_outbox_temporal.contract.purge import (
    PURGE_BATCH_WORKFLOW_TYPE,
    PurgeBatchInput,
    PurgeBatchProgress,
    purge_batch_workflow_id,
)

from tests.api.conftest import Api
from tests.api.test_items import assert_problem
from tests.workflows.test_lane import wait_for
from worker import default_operations_task_queue


async def enqueue_later(api: Api, outbox: str, key: str) -> None:
    response = await api.http.post(
        f"/v1/outboxes/{outbox}/items",
        json={"destination": api.webhook.name, "payload": {"key": key}, "delay_seconds": 3600},
        headers={"Idempotency-Key": key},
    )
    assert response.status_code == 202, response.text


async def listed(api: Api, outbox: str, count: int) -> None:
    """Visibility trails the starts by a moment: wait until it lists them all."""

    async def all_listed() -> bool:
        return len(await api.stack.outbox.queued_keys(outbox)) == count

    await wait_for(all_listed)


async def batch_end(http: httpx.AsyncClient, url: str) -> list[dict[str, Any]]:
    """Every distinct answer of the batch's status URL until it ends, the last one last."""
    seen: list[dict[str, Any]] = []
    for _ in range(600):
        response = await http.get(url)
        assert response.status_code == 200, response.text
        if not seen or seen[-1] != response.json():
            seen.append(response.json())
        if response.json()["state"] != "running":
            return seen
        await asyncio.sleep(0.05)
    raise AssertionError(f"the batch never ended: {seen[-1]}")


async def purge(http: httpx.AsyncClient, outbox: str, **body: Any) -> dict[str, Any]:
    """Purge the outbox through the API and follow the batch: its last answer."""
    started = await http.post(f"/v1/outboxes/{outbox}/items:purge", json=body)
    assert started.status_code == 202, started.text
    return (await batch_end(http, started.headers["location"]))[-1]


async def test_a_purge_answers_at_once_and_its_batch_cancels_every_queued_item(
    api_factory: Any, dev_env: Any
) -> None:
    api: Api = await api_factory(env=dev_env)
    outbox = f"purge-{uuid.uuid4().hex[:8]}"
    keys = [f"later-{n}" for n in range(3)]
    for key in keys:
        await enqueue_later(api, outbox, key)
    await listed(api, outbox, 3)

    started = await api.http.post(f"/v1/outboxes/{outbox}/items:purge", json={"reason": "oops"})
    assert started.status_code == 202, started.text
    body = started.json()
    assert started.headers["location"] == body["links"]["self"]
    assert body["links"]["self"] == f"/v1/outboxes/{outbox}/purge-batches/{body['id']}"
    assert (body["state"], body["cancelled"], body["keys"], body["done"]) == (
        "running",
        0,
        [],
        False,
    )
    answers = await batch_end(api.http, started.headers["location"])
    end = answers[-1]
    await api.stack.record_history(purge_batch_workflow_id(outbox, body["id"]))

    assert (end["state"], end["done"], end["failure"]) == ("completed", True, None)
    assert (end["cancelled"], end["skipped"], end["keys"]) == (3, 0, keys)
    assert end["reason"] == "oops" and end["finished_at"] is not None
    for key in keys:
        item = (await api.http.get(f"/v1/outboxes/{outbox}/items/{key}")).json()
        assert item["status"] == "cancelled"
    # Nothing left: a second purge cancels nothing.
    assert (await purge(api.http, outbox))["cancelled"] == 0


async def test_a_purge_of_an_unknown_destination_or_batch_is_404(api: Api) -> None:
    unknown = await api.http.post("/v1/outboxes/tests/items:purge", json={"destination": "nope"})
    assert_problem(unknown, 404)
    missing = await api.http.get(f"/v1/outboxes/tests/purge-batches/{uuid.uuid4().hex}")
    assert_problem(missing, 404, "purge-batch-not-found")
    assert_problem(await api.http.get("/v1/outboxes/tests/purge-batches/not-an-id"), 422)


async def test_a_batch_whose_pages_cannot_run_ends_failed_with_the_reason(
    api_factory: Any, dev_env: Any
) -> None:
    api: Api = await api_factory(env=dev_env)
    # Started past the API's checks (a destination removed from the configuration since).
    batch_id = uuid.uuid4().hex
    await api.stack.client.start_workflow(
        PURGE_BATCH_WORKFLOW_TYPE,
        PurgeBatchInput(
            default_operations_task_queue(api.stack.task_queue),
            PurgeBatchProgress("tests", destination="removed-since"),
        ),
        id=purge_batch_workflow_id("tests", batch_id),
        task_queue=api.stack.task_queue,
    )

    end = (await batch_end(api.http, f"/v1/outboxes/tests/purge-batches/{batch_id}"))[-1]
    await api.stack.record_history(purge_batch_workflow_id("tests", batch_id))

    assert (end["state"], end["done"], end["pages"]) == ("failed", False, 0)
    assert end["failure"] == (
        "page 1 failed after its retries: UnknownDestination: unknown destination 'removed-since'"
    )
