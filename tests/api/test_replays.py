"""Replays through the API on a real stack: the selected items sent again as new items to a
target, linked both ways, erased payloads skipped and counted, a repeat adding nothing, and the
bad inputs refused as problems."""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from durable_outbox_temporal.contract.ids import item_workflow_id
from durable_outbox_temporal.contract.item import ItemStatus
from durable_outbox_temporal.contract.replay import (
    ReplayFilter,
    ReplayPageRequest,
    replay_batch_workflow_id,
)

from activities.replay import ReplayActivities
from service.items import ItemService
from tests.api.conftest import Api
from tests.api.test_dead_letters import batch_done, enqueue
from tests.api.test_items import assert_problem
from tests.fakes import submits


async def test_a_replay_sends_the_selected_items_again_linked_both_ways(api: Api) -> None:
    outbox = f"rp-{uuid.uuid4().hex[:8]}"  # its own outbox: the filter is the outbox's
    hook = api.webhook.name
    for key in ("inv-1", "inv-2", "inv-3", "other-1"):
        await enqueue(api, outbox, key, hook)
        await api.stack.result(item_workflow_id(outbox, key))
    erased = await api.http.delete(f"/v1/outboxes/{outbox}/items/inv-3/payload")
    assert erased.status_code == 200, erased.text

    started = await api.http.post(
        f"/v1/outboxes/{outbox}/replays",
        json={"target": hook, "statuses": ["sent"], "key_prefix": "inv-"},
    )
    assert started.status_code == 202, started.text
    assert started.headers["location"] == started.json()["links"]["self"]
    replay = await batch_done(api.http, started.headers["location"])

    assert (replay["replayed"], replay["already"], replay["erased"], replay["pruned"]) == (
        2,
        0,
        1,
        0,
    )
    assert replay["state"] == "completed" and replay["created_before"] is not None
    # Under a name of its own: the replayed items' results below record under the test's name.
    await api.stack.record_history(replay_batch_workflow_id(outbox, replay["id"]), "_replay_batch")
    new_keys = [f"replay:{replay['id']}:inv-1", f"replay:{replay['id']}:inv-2"]
    for key in new_keys:
        sent = await api.stack.result(item_workflow_id(outbox, key))
        assert sent.status is ItemStatus.SENT and sent.destination == hook
        assert await submits(api.stack.fake, item_workflow_id(outbox, key)) == 1
    original = (await api.http.get(f"/v1/outboxes/{outbox}/items/inv-1")).json()
    assert original["replays"] == [new_keys[0]] and original["replay_of"] is None
    copy = (await api.http.get(f"/v1/outboxes/{outbox}/items/{new_keys[0]}")).json()
    assert copy["replay_of"] == "inv-1" and copy["replays"] == []

    # A page run again (a retried activity) finds the new keys taken: nothing more is sent.
    page = ReplayActivities(
        ItemService(api.stack.outbox, api.stack.engine).enqueue_many, api.stack.engine
    )
    again = await page.replay_page(
        ReplayPageRequest(
            outbox=outbox,
            replay_id=replay["id"],
            filter=ReplayFilter(statuses=["sent"], key_prefix="inv-"),
            target=hook,
            created_before=datetime.fromisoformat(replay["created_before"]),
            cursor=None,
        )
    )
    assert (again.replayed, again.already, again.erased) == (0, 2, 1)
    for key in new_keys:
        assert await submits(api.stack.fake, item_workflow_id(outbox, key)) == 1
    inv_1 = (await api.http.get(f"/v1/outboxes/{outbox}/items/inv-1")).json()
    assert inv_1["replays"] == [new_keys[0]]


async def test_a_large_replay_needs_its_count_confirmed(api_factory: Any) -> None:
    api: Api = await api_factory(replay_confirm_over=1)
    outbox = f"rp-{uuid.uuid4().hex[:8]}"
    for key in ("a", "b"):
        await enqueue(api, outbox, key, api.webhook.name)
        await api.stack.result(item_workflow_id(outbox, key))
    url = f"/v1/outboxes/{outbox}/replays"

    refused = assert_problem(await api.http.post(url, json={"target": api.webhook.name}), 409)
    assert refused["code"] == "replay-confirmation-required" and refused["count"] == 2
    wrong = await api.http.post(url, json={"target": api.webhook.name, "confirm_count": 3})
    assert assert_problem(wrong, 409)["count"] == 2
    confirmed = await api.http.post(url, json={"target": api.webhook.name, "confirm_count": 2})
    assert confirmed.status_code == 202, confirmed.text
    assert (await batch_done(api.http, confirmed.headers["location"]))["replayed"] == 2


async def test_bad_replays_are_problems_naming_what_is_wrong(api: Api) -> None:
    url = "/v1/outboxes/tests/replays"
    unknown = assert_problem(await api.http.post(url, json={"target": "nowhere"}), 404)
    assert unknown["code"] == "unknown-destination" and "nowhere" in unknown["detail"]
    for bounds in (
        {"created_from": "2026-01-02T00:00:00Z", "created_to": "2026-01-01T00:00:00Z"},
        {"created_from": "2026-01-01T00:00:00Z", "created_to": "2026-01-01T00:00:00Z"},
    ):
        empty = await api.http.post(url, json={"target": api.webhook.name, **bounds})
        assert "created_from" in str(assert_problem(empty, 422))
    for body in (
        {},  # no target
        {"target": api.webhook.name, "statuses": ["lost"]},
        {"target": api.webhook.name, "statuses": []},
        {"target": api.webhook.name, "confirm_count": -1},
        {"target": api.webhook.name, "key_prefix": "a/b"},
        {"target": api.webhook.name, "surprise": 1},
    ):
        assert_problem(await api.http.post(url, json=body), 422)
    missing = await api.http.get(f"{url}/{uuid.uuid4().hex}")
    assert assert_problem(missing, 404)["code"] == "replay-not-found"
    assert_problem(await api.http.get(f"{url}/not-an-id"), 422)


async def test_a_token_of_another_outbox_may_not_replay(api_factory: Any, tmp_path: Path) -> None:
    digest = hashlib.sha256(b"billing-operator").hexdigest()
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        f'[tokens.billing]\nsha256 = "{digest}"\nscopes = ["operate", "read"]\n'
        'outboxes = ["billing"]\n'
    )
    api: Api = await api_factory(api_token="root-token", api_tokens_file=str(tokens))
    headers = {"Authorization": "Bearer billing-operator"}

    refused = await api.http.post(
        "/v1/outboxes/payroll/replays", json={"target": api.webhook.name}, headers=headers
    )
    assert_problem(refused, 403)
    # Its own outbox gets past the token to the request's own check.
    own = await api.http.post(
        "/v1/outboxes/billing/replays", json={"target": "nowhere"}, headers=headers
    )
    assert assert_problem(own, 404)["code"] == "unknown-destination"
