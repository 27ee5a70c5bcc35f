"""The provider's error code travels with a failed item: view, history, read model and filter."""

from __future__ import annotations

from durable_outbox_temporal.contract.ids import item_workflow_id

from tests.api.conftest import Api
from tests.api.test_items import enqueue
from tests.fakes import script

SUPPRESSED = "EmailDroppedAllRecipientsSuppressed"  # what the fake's failed operation reports


async def test_a_failed_operation_keeps_the_providers_error_code(api: Api) -> None:
    await script(
        api.stack.fake, item_workflow_id("tests", "dropped"), [{"operation_result": "Failed"}]
    )
    response = await enqueue(api, "dropped")
    await api.stack.failure(response.json()["id"])
    fine = await enqueue(api, "fine")
    await api.stack.result(fine.json()["id"])

    item = (await api.http.get(response.json()["links"]["self"])).json()
    events = (await api.http.get(response.json()["links"]["events"])).json()
    listed = (
        await api.http.get("/v1/outboxes/tests/items", params={"error_code": SUPPRESSED})
    ).json()

    assert item["status"] == "failed" and item["last_error_code"] == SUPPRESSED
    assert item["source"] == "read-model"
    assert events[-1]["type"] == "failed" and events[-1]["error_code"] == SUPPRESSED
    assert all(event["error_code"] is None for event in events[:-1])
    assert [listed_item["key"] for listed_item in listed["items"]] == ["dropped"]


async def test_a_refused_submit_keeps_the_providers_error_code(api: Api) -> None:
    # The fake answers in ACS's error shape: {"error": {"code": "Injected", "message": ...}}.
    await script(api.stack.fake, item_workflow_id("tests", "refused"), [{"status": 400}])
    response = await enqueue(api, "refused")
    await api.stack.failure(response.json()["id"])

    item = (await api.http.get(response.json()["links"]["self"])).json()

    assert item["status"] == "failed" and item["last_error_code"] == "Injected"
