"""Retention through the API: an item whose payload was pruned says so and its redrive is a 409
naming why; a key whose row was pruned long after it was sent is still a 200 (the same request)
and is never sent again, and another request under it is still a conflict. The pruning itself:
`tests/readmodel/test_retention.py`; the schedule that runs it:
`tests/workflows/test_retention.py`."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from durable_outbox_temporal.contract.ids import item_workflow_id
from durable_outbox_temporal.contract.item import ItemProjection, ItemStatus
from durable_outbox_temporal.contract.retention import RetentionRule

from readmodel import store
from readmodel.retention import prune_payloads, prune_rows
from tests.api.conftest import Api
from tests.api.test_dead_letters import refuse
from tests.api.test_items import assert_problem
from tests.fakes import deliveries
from tests.readmodel import test_store

# Every item of the destination, however recently it ended (the time-skipping server's clock,
# which stamps their ends, runs ahead of the wall clock).
LATER = datetime(3000, 1, 1, tzinfo=UTC)


def everything(api: Api) -> RetentionRule:
    return RetentionRule(api.webhook.name, None, payload_retention_s=1, item_retention_s=1)


async def enqueue(
    api: Api, outbox: str, key: str, payload: dict[str, str]
) -> tuple[int, dict[str, object]]:
    response = await api.http.post(
        f"/v1/outboxes/{outbox}/items",
        json={"destination": api.webhook.name, "payload": payload},
        headers={"Idempotency-Key": key},
    )
    return response.status_code, response.json()


async def test_a_pruned_payload_says_so_and_refuses_a_redrive(api_factory: Any) -> None:
    api: Api = await api_factory()
    outbox = f"kept-{uuid.uuid4().hex[:8]}"
    await refuse(api, outbox, "dead")  # the provider refuses it for good: a dead letter
    status, body = await enqueue(api, outbox, "dead", {"to": "someone"})
    assert status == 202, body
    await api.stack.failure(item_workflow_id(outbox, "dead"))
    item = (await api.http.get(f"/v1/outboxes/{outbox}/items/dead")).json()
    assert item["status"] == "failed" and item["payload_pruned_at"] is None

    assert prune_payloads(api.stack.engine, everything(api), LATER, limit=10).pruned == 1

    pruned = (await api.http.get(f"/v1/outboxes/{outbox}/items/dead")).json()
    assert pruned["payload"] is None and pruned["payload_pruned_at"] is not None
    redrive = await api.http.post(f"/v1/outboxes/{outbox}/items/dead/redrive")
    refused = assert_problem(redrive, 409)
    assert refused["code"] == "payload-pruned" and "pruned" in refused["detail"]


async def test_a_key_whose_row_was_pruned_is_still_a_200_and_never_sent_again(
    api_factory: Any,
) -> None:
    api: Api = await api_factory()
    outbox = f"kept-{uuid.uuid4().hex[:8]}"
    payload = {"hello": "long ago"}
    status, body = await enqueue(api, outbox, "once", payload)
    assert status == 202, body
    item_id = str(body["id"])
    await api.stack.result(item_id)

    assert prune_rows(api.stack.engine, everything(api), LATER, limit=10).pruned == 1
    assert store.get_item(api.stack.engine, item_id) is None

    again_status, again = await enqueue(api, outbox, "once", payload)
    assert (again_status, again["created"], again["status"]) == (200, False, "sent")
    assert await deliveries(api.stack.fake, item_id) == 1
    conflict = assert_problem(
        await api.http.post(
            f"/v1/outboxes/{outbox}/items",
            json={"destination": api.webhook.name, "payload": {"hello": "another"}},
            headers={"Idempotency-Key": "once"},
        ),
        409,
    )
    assert conflict["code"] == "idempotency-conflict"


async def test_a_pruned_keys_digest_is_erased_and_a_repeat_is_then_told_its_status(
    api_factory: Any,
) -> None:
    api: Api = await api_factory()
    outbox = f"kept-{uuid.uuid4().hex[:8]}"
    status, body = await enqueue(api, outbox, "once", {"hello": "long ago"})
    assert status == 202, body
    await api.stack.result(str(body["id"]))
    assert prune_rows(api.stack.engine, everything(api), LATER, limit=10).pruned == 1

    # Temporal still holds the workflow here; the read model holds only the key's memory.
    erased = await api.http.delete(f"/v1/outboxes/{outbox}/items/once/payload")

    assert erased.status_code == 200, erased.text
    assert erased.json()["erased_at"]
    again = await api.http.delete(f"/v1/outboxes/{outbox}/items/once/payload")
    assert again.json() == erased.json()
    # With the digest gone, a repeat of the key is told its status, whatever its request.
    other_status, other = await enqueue(api, outbox, "once", {"hello": "another"})
    assert (other_status, other["created"], other["status"]) == (200, False, "sent")
    assert await deliveries(api.stack.fake, str(body["id"])) == 1
    unknown = await api.http.delete(f"/v1/outboxes/{outbox}/items/never/payload")
    assert_problem(unknown, 404)


async def test_an_item_whose_row_and_workflow_are_gone_is_a_410_saying_how_it_ended(
    api_factory: Any,
) -> None:
    # Retention deleted its row, and Temporal's retention its workflow (this one never had
    # one): a 404 here would read as "never sent", and a caller might send it again.
    api: Api = await api_factory()
    outbox = f"kept-{uuid.uuid4().hex[:8]}"
    ended = datetime(2026, 1, 2, tzinfo=UTC)
    view = test_store.view(
        "long-ago", 2, ItemStatus.SENT, outbox, finished_at=ended, destination=api.webhook.name
    )
    store.apply_projection(api.stack.engine, ItemProjection(view, [], ended, payload={"k": 1}))
    assert prune_rows(api.stack.engine, everything(api), LATER, limit=10).pruned == 1

    gone = assert_problem(await api.http.get(f"/v1/outboxes/{outbox}/items/long-ago"), 410)

    assert gone["code"] == "item-pruned" and gone["item_status"] == "sent"
    assert gone["finished_at"] == ended.isoformat() and gone["pruned_at"]
    assert "never sent again" in gone["detail"]
    for what in ("attempts", "events"):
        answer = await api.http.get(f"/v1/outboxes/{outbox}/items/long-ago/{what}")
        also = assert_problem(answer, 410)
        assert (also["code"], also["item_status"]) == ("item-pruned", "sent"), what
    never = await api.http.get(f"/v1/outboxes/{outbox}/items/never-was")
    assert assert_problem(never, 404)["code"] == "item-not-found"
