"""Cancel during a worker outage: recorded as the `request_cancel` signal, applied on return."""

from __future__ import annotations

from durable_outbox_temporal.contract.ids import item_workflow_id
from durable_outbox_temporal.contract.item import REQUEST_CANCEL_SIGNAL, ItemStatus

from tests.api.conftest import Api, api_settings, open_api
from tests.api.test_items import EMAIL, enqueue
from tests.conftest import email_destination
from tests.fakes import script, submits
from tests.workflows.test_outbox_item import wait_for_status

# The item's first submit is refused for an hour: it sits `queued`, waiting on a durable timer.
AN_HOUR_OF_503 = [{"status": 503, "retry_after": "3600"}]


async def test_cancel_with_the_worker_stopped_is_202_and_applies_when_it_returns(
    stack_factory, dev_env, fake_provider
) -> None:
    # On the dev server: a stopping worker hands its sticky queue back there, as in production.
    email = email_destination(fake_provider)
    stack = await stack_factory(email, env=dev_env)
    settings = api_settings(workflow_task_queue=stack.task_queue, cancel_wait_s=0.5)
    served = open_api(stack, settings)
    http = await served.__anext__()
    try:
        item_id = item_workflow_id("tests", "outage")
        await script(stack.fake, item_id, AN_HOUR_OF_503)
        body = {"destination": email.name, "payload": EMAIL}
        await http.post(
            "/v1/outboxes/tests/items", json=body, headers={"Idempotency-Key": "outage"}
        )
        await wait_for_status(stack, "outage", attempts=1)
        await stack.shutdown()

        response = await http.post(
            "/v1/outboxes/tests/items/outage/cancel", json={"reason": "customer left"}
        )

        assert response.status_code == 202, response.text
        answer = response.json()
        assert answer["cancel_requested"] is True and answer["reason"] == "customer left"
        # A worker comes back on the same task queues and finds the recorded cancel.
        await stack_factory(email, env=dev_env, task_queue=stack.task_queue)
        view = await stack.result(item_id)
        assert view.status is ItemStatus.CANCELLED
        assert await submits(stack.fake, item_id) == 1  # the hour's retry never happened
        item = (await http.get(answer["links"]["self"])).json()
        assert item["status"] == "cancelled"
    finally:
        await served.aclose()


async def test_cancel_with_a_worker_running_is_still_answered_at_once(api: Api) -> None:
    item_id = item_workflow_id("tests", "live-cancel")
    await script(api.stack.fake, item_id, AN_HOUR_OF_503)
    await enqueue(api, "live-cancel")
    await wait_for_status(api.stack, "live-cancel", attempts=1)

    response = await api.http.post("/v1/outboxes/tests/items/live-cancel/cancel", json={})

    assert response.status_code == 200 and response.json()["status"] == "cancelled"


async def test_request_cancel_signal_sent_as_raw_json_by_any_client(api: Api) -> None:
    # What a Go or TypeScript service sends: the signal's name and a JSON object.
    item_id = item_workflow_id("tests", "raw-signal")
    await script(api.stack.fake, item_id, AN_HOUR_OF_503)
    await enqueue(api, "raw-signal")
    await wait_for_status(api.stack, "raw-signal", attempts=1)

    handle = api.stack.client.get_workflow_handle(item_id)
    await handle.signal(REQUEST_CANCEL_SIGNAL, {"reason": "from another language"})
    view = await api.stack.result(item_id)

    assert view.status is ItemStatus.CANCELLED
    events = (await api.http.get("/v1/outboxes/tests/items/raw-signal/events")).json()
    assert events[-1]["type"] == "cancelled" and events[-1]["detail"] == "from another language"


async def test_request_cancel_is_ignored_once_the_item_is_sending(api: Api) -> None:
    item_id = item_workflow_id("tests", "too-late")
    await script(api.stack.fake, item_id, [{"running_polls": 3}])
    await enqueue(api, "too-late")
    await wait_for_status(api.stack, "too-late", status=ItemStatus.SENDING)

    handle = api.stack.client.get_workflow_handle(item_id)
    await handle.signal(REQUEST_CANCEL_SIGNAL, {"reason": "too late"})
    view = await api.stack.result(item_id)

    assert view.status is ItemStatus.SENT
