"""Dead letters through the API on a real stack: list with error and attempts, filters,
discard, and a batch redrive whose progress any API instance reads back from Temporal."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from durable_outbox_temporal import InvalidRequest
from durable_outbox_temporal.contract.dead_letters import DeadLetterFilter
from durable_outbox_temporal.contract.ids import item_workflow_id, provider_idempotency_key
from durable_outbox_temporal.contract.item import ItemStatus

from service.dead_letters import DeadLetterService
from service.items import ItemService
from tests.api.conftest import Api, api_settings, open_api
from tests.api.test_items import EMAIL


async def enqueue(api: Api, outbox: str, key: str, destination: str) -> None:
    payload = EMAIL if destination == api.email.name else {"key": key}
    response = await api.http.post(
        f"/v1/outboxes/{outbox}/items",
        json={"destination": destination, "payload": payload},
        headers={"Idempotency-Key": key},
    )
    assert response.status_code == 202, response.text


async def refuse(api: Api, outbox: str, key: str, generation: int = 0) -> None:
    """The provider refuses the item's submit for good (400) in this generation."""
    provider_key = provider_idempotency_key(item_workflow_id(outbox, key), generation)
    await api.stack.fake.admin.script(provider_key, [{"status": 400}])


async def dead_letters(api: Api, outbox: str, **params: Any) -> list[str]:
    response = await api.http.get(f"/v1/outboxes/{outbox}/dead-letters", params=params)
    assert response.status_code == 200, response.text
    return [letter["key"] for letter in response.json()["dead_letters"]]


async def batch_done(http: Any, url: str) -> dict[str, Any]:
    for _ in range(200):
        response = await http.get(url)
        assert response.status_code == 200, response.text
        if response.json()["done"]:
            return dict(response.json())
        await asyncio.sleep(0.05)
    raise AssertionError(f"the batch never finished: {response.json()}")


async def test_dead_letters_are_listed_filtered_discarded_and_redriven_as_a_batch(
    api_factory: Any,
) -> None:
    api: Api = await api_factory()
    outbox = f"dl-{uuid.uuid4().hex[:8]}"  # its own outbox: the list is the outbox's
    hook, mail = api.webhook.name, api.email.name
    for key in ("hook-1", "hook-2", "mail-1", "again"):
        await refuse(api, outbox, key)
    # Redriven, `again` is refused again: the batch must not take it a second time.
    await refuse(api, outbox, "again", generation=1)
    plan = {"hook-1": hook, "hook-2": hook, "mail-1": mail, "again": hook, "fine": hook}
    for key, destination in plan.items():
        await enqueue(api, outbox, key, destination)
        if key == "fine":
            await api.stack.result(item_workflow_id(outbox, key))
        else:
            await api.stack.failure(item_workflow_id(outbox, key))

    listed = (await api.http.get(f"/v1/outboxes/{outbox}/dead-letters")).json()["dead_letters"]
    assert [letter["key"] for letter in listed] == ["again", "mail-1", "hook-2", "hook-1"]
    first = listed[-1]
    assert first["attempts"] == 1 and first["last_error"] and first["failed_at"]
    assert first["discarded"] is False and first["links"]["redrive"].endswith("/redrive")
    assert await dead_letters(api, outbox, destination=mail) == ["mail-1"]
    # The fake refuses in ACS's error shape, code "Injected", whichever the destination.
    assert len(await dead_letters(api, outbox, error_code="Injected")) == 4
    assert await dead_letters(api, outbox, error_code="EmailDropped") == []
    assert await dead_letters(api, outbox, failed_from=listed[0]["failed_at"]) == ["again"]
    backwards = await api.http.get(
        f"/v1/outboxes/{outbox}/dead-letters",
        params={"failed_from": listed[0]["failed_at"], "failed_to": listed[-1]["failed_at"]},
    )
    assert backwards.status_code == 422

    discarded = await api.http.post(
        f"/v1/outboxes/{outbox}/dead-letters/hook-2/discard", json={"reason": "bad address"}
    )
    assert discarded.status_code == 200, discarded.text
    assert discarded.json()["discarded"] is True
    assert discarded.json()["discard_reason"] == "bad address"
    assert await dead_letters(api, outbox) == ["again", "mail-1", "hook-1"]
    everything = await dead_letters(api, outbox, include_discarded="true")
    assert everything == ["again", "mail-1", "hook-2", "hook-1"]
    not_failed = await api.http.post(f"/v1/outboxes/{outbox}/dead-letters/fine/discard")
    assert not_failed.status_code == 409
    assert not_failed.headers["content-type"] == "application/problem+json"
    unknown = await api.http.post(f"/v1/outboxes/{outbox}/dead-letters/nobody/discard")
    assert unknown.status_code == 404

    started = await api.http.post(
        f"/v1/outboxes/{outbox}/dead-letters:redrive", json={"destination": hook}
    )
    assert started.status_code == 202, started.text
    assert started.headers["location"] == started.json()["links"]["self"]
    batch = await batch_done(api.http, started.headers["location"])

    # hook-1 and `again`: not the discarded hook-2, not mail-1 (another destination).
    assert (batch["redriven"], batch["skipped"], batch["state"]) == (2, 0, "completed")
    assert batch["destination"] == hook and batch["failed_before"] is not None
    hook_1 = await api.stack.result(item_workflow_id(outbox, "hook-1"))
    assert hook_1.status is ItemStatus.SENT
    await api.stack.failure(item_workflow_id(outbox, "again"))
    assert await dead_letters(api, outbox) == ["again", "mail-1"]

    # Another API instance (a restarted one) reads the same batch from Temporal.
    settings = api_settings(
        workflow_task_queue=api.stack.task_queue,
        operations_task_queue=f"{api.stack.task_queue}-operations",
    )
    restarted = open_api(api.stack, settings)
    http = await restarted.__anext__()
    try:
        again = (await http.get(started.headers["location"])).json()
    finally:
        await restarted.aclose()
    assert again == batch


async def test_an_unknown_batch_is_404_and_a_bad_filter_422(api: Api) -> None:
    missing = await api.http.get(f"/v1/outboxes/tests/redrive-batches/{uuid.uuid4().hex}")
    assert missing.status_code == 404
    bad = await api.http.post(
        "/v1/outboxes/tests/dead-letters:redrive", json={"failed_from": "yesterday"}
    )
    assert bad.status_code == 422
    naive = await api.http.post(
        "/v1/outboxes/tests/dead-letters:redrive", json={"failed_to": "2026-01-01T00:00:00"}
    )
    assert naive.status_code == 422


@pytest.mark.parametrize(
    "which",
    [
        DeadLetterFilter(failed_from=datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14)))),
        DeadLetterFilter(
            failed_to=datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-14)))
        ),
    ],
)
async def test_a_filter_date_outside_years_1_to_9999_starts_no_batch(
    api: Api, which: DeadLetterFilter
) -> None:
    """Issue 31: such a date started a batch whose every page then failed, for ever. Callers
    of the service (not only the API's routes) are refused at once."""
    dead_letters = DeadLetterService(ItemService(api.stack.outbox, api.stack.engine), "ops")

    with pytest.raises(InvalidRequest, match="years 1 to 9999"):
        await dead_letters.start_redrive("tests", which)
    with pytest.raises(InvalidRequest, match="years 1 to 9999"):
        await dead_letters.list("tests", which)
