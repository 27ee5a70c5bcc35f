"""A submit whose attempt failed after it may have reached the provider (a worker killed once the
request went) is never withdrawn by a cancel: the server's own retry waits out a backoff during
which a cancel is done at once and looks to the workflow like a submit no worker took, so such a
submit's retries are the workflow's (`workflows.delivery.WITHDRAWABLE_ATTEMPT`). On the real dev
server: the backoff is wall-clock time there, as in production."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from durable_outbox_temporal.contract.bulk import shard_workflow_id
from durable_outbox_temporal.contract.ids import item_workflow_id
from durable_outbox_temporal.contract.item import (
    SUBMIT_ACTIVITY,
    SUBMIT_BATCH_ACTIVITY,
    BatchProgress,
    ItemErrorType,
    ItemStatus,
    OutboxItemView,
    SubmitOutcome,
    SubmitRequest,
    SubmitResult,
)
from durable_outbox_temporal.errors import CannotCancel
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.exceptions import ActivityError, RetryState
from temporalio.worker import ExecuteActivityInput

from activities.delivery import DeliveryActivities, went_through
from readmodel import store
from tests.conftest import email_destination, unique_name
from tests.fakes import deliveries, script, submits
from tests.workflows.test_bulk import enqueue_all, enqueue_in_one_signal, until_settled
from tests.workflows.test_lost_activity_tasks import Execute, FirstRunOf
from tests.workflows.test_outbox_item import EMAIL
from workflows.host import _Batcher

# Well within the server's one-second backoff before its own retry, which the code before this
# waited out with the submit still withdrawable.
INTO_THE_BACKOFF_S = 0.2


class FailsOnceItSent(FirstRunOf):
    """The first run of an activity of `activity_type` sends its requests, then fails
    unclassified, as a worker killed once the provider had them."""

    def __init__(self, activity_type: str) -> None:
        super().__init__(activity_type, self._sends_then_fails)
        self.failed = asyncio.Event()

    async def _sends_then_fails(self, input: ExecuteActivityInput, execute: Execute) -> Any:
        await execute(input)
        self.failed.set()
        raise RuntimeError("the worker died once the provider had the request")


async def cancel_during_the_backoff(
    stack: Any, key: str, failing: FailsOnceItSent, known: OutboxItemView | None = None
) -> None:
    await asyncio.wait_for(failing.failed.wait(), timeout=30)
    await asyncio.sleep(INTO_THE_BACKOFF_S)
    # The retry may have its answer already: nothing is left to cancel then.
    with contextlib.suppress(CannotCancel):
        await stack.outbox.cancel("tests", key, "changed my mind", known=known)


async def submits_scheduled(stack: Any, workflow_id: str, activity_type: str) -> int:
    handle = stack.client.get_workflow_handle(workflow_id)
    scheduled = [
        event
        async for event in handle.fetch_history_events()
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and event.activity_task_scheduled_event_attributes.activity_type.name == activity_type
    ]
    return len(scheduled)


async def test_a_cancel_after_a_submit_attempt_failed_leaves_the_item_to_its_retry(
    stack_factory, fake_provider, dev_env
) -> None:
    destination = email_destination(fake_provider)
    failing = FailsOnceItSent(SUBMIT_ACTIVITY)
    stack = await stack_factory(destination, env=dev_env, interceptors=[failing])
    item = await stack.enqueue(destination, EMAIL, key=unique_name("retried"))

    await cancel_during_the_backoff(stack, item.key, failing)
    view = await stack.result(item.item_id)

    assert view.status is ItemStatus.SENT, view
    assert await deliveries(fake_provider, item.item_id) == 1
    # The failed attempt's activity, then the workflow's own retry.
    assert await submits_scheduled(stack, item.item_id, SUBMIT_ACTIVITY) == 2
    await stack.record_history(item.item_id)


async def test_a_cancel_after_a_shared_submit_attempt_failed_leaves_the_item_to_its_retry(
    stack_factory, fake_provider, dev_env
) -> None:
    destination = email_destination(fake_provider, mode="bulk", shards=1, submit_batch=5)
    failing = FailsOnceItSent(SUBMIT_BATCH_ACTIVITY)
    stack = await stack_factory(destination, env=dev_env, interceptors=[failing])
    [item_id] = await enqueue_all(stack, destination, [unique_name("retried")])
    # The item as the read model showed it before the attempt wrote its outcome (a worker killed
    # between the provider's answer and that write leaves it `queued` there): the API cancels a
    # shard's item by signal when its row says it is queued.
    queued = store.get_item(stack.engine, item_id)
    assert queued is not None and queued.view.status is ItemStatus.QUEUED, queued

    await cancel_during_the_backoff(stack, queued.view.key, failing, queued.view)
    await until_settled(stack, [item_id])

    row = store.get_item(stack.engine, item_id)
    assert row is not None and row.view.status is ItemStatus.SENT, row
    assert await deliveries(fake_provider, item_id) == 1
    await stack.record_history(shard_workflow_id(destination.name, 0), "_shard")


async def test_a_submit_tried_again_by_its_workflow_numbers_its_rows_after_the_failed_attempts(
    stack_factory, fake_provider, dev_env
) -> None:
    # The failed attempt wrote `accepted` and its first poll's `polled` (Running) before it
    # failed; the workflow's retry, the first attempt of a new activity, finds the operation
    # succeeded. Rows are idempotent by (item, seq): had the retry reused those numbers, its
    # `sent` would have been dropped and the read model would show the item sending for ever.
    destination = email_destination(
        fake_provider, poll_in_submit=True, poll_interval_s=0.2, poll_rate=200
    )
    failing = FailsOnceItSent(SUBMIT_ACTIVITY)
    stack = await stack_factory(destination, env=dev_env, interceptors=[failing])
    key = unique_name("renumbered")
    await script(fake_provider, item_workflow_id("tests", key), [{"running_polls": 1}])
    item = await stack.enqueue(destination, EMAIL, key=key)

    view = await stack.result(item.item_id)

    assert view.status is ItemStatus.SENT, view
    assert await deliveries(fake_provider, item.item_id) == 1
    await until_settled(stack, [item.item_id], timeout_s=10, skip_time=False)
    events = [(e.seq, e.type.value) for e in store.item_events(stack.engine, item.item_id)]
    assert [kind for _, kind in events][-1] == "sent", events
    assert len({seq for seq, _ in events}) == len(events), events


class DiesOnceTheFirstIsRecorded(FirstRunOf):
    """The first batch of submits sends every request, heartbeats the outcome of its first
    alone (`BatchProgress`), then never answers, as a worker killed before its next heartbeat:
    the batch times out on its heartbeats."""

    def __init__(self) -> None:
        super().__init__(SUBMIT_BATCH_ACTIVITY, self._records_the_first_then_dies)
        self.recorded: str | None = None  # the item whose outcome the heartbeat carried

    async def _records_the_first_then_dies(
        self, input: ExecuteActivityInput, execute: Execute
    ) -> Any:
        outcomes = await execute(input)
        self.recorded = input.args[0][0].item_id
        activity.heartbeat(BatchProgress({"0": outcomes[0]}))
        # Until the SDK hears the server timed it out, or the worker stops.
        await asyncio.sleep(3600)


async def test_a_batch_tried_again_by_its_shard_sends_only_what_its_heartbeat_did_not_record(
    stack_factory, fake_provider
) -> None:
    destination = email_destination(fake_provider, mode="bulk", shards=1, submit_batch=5)
    dying = DiesOnceTheFirstIsRecorded()
    stack = await stack_factory(destination, interceptors=[dying])
    # Together, in one signal, so that they go in one batch whatever the hand-overs' timing.
    keys = [unique_name("batch") for _ in range(3)]
    item_ids = await enqueue_in_one_signal(stack, destination, keys)

    await until_settled(stack, item_ids)

    for item_id in item_ids:
        row = store.get_item(stack.engine, item_id)
        assert row is not None and row.view.status is ItemStatus.SENT, row
        assert await deliveries(fake_provider, item_id) == 1
        assert await submits(fake_provider, item_id) == (1 if item_id == dying.recorded else 2)
    shard = shard_workflow_id(destination.name, 0)
    assert await submits_scheduled(stack, shard, SUBMIT_BATCH_ACTIVITY) == 2
    await stack.record_history(shard, "_shard")


def submit_request(item_id: str, sequence: str | None = None) -> SubmitRequest:
    return SubmitRequest(
        destination="d",
        item_id=item_id,
        idempotency_key=item_id,
        payload={},
        attempt=1,
        sequence=sequence,
    )


REFUSED = SubmitOutcome(error_type=ItemErrorType.TRANSIENT, message="503")
DELIVERED = SubmitOutcome(SubmitResult(delivered=True))
UNTRIED = SubmitOutcome(not_attempted=True)
# A lane's run whose first request was recorded not going through, another whose first was
# recorded delivered, a request of no run recorded delivered and one not recorded.
RUNS = [
    submit_request("stopped-1", "stopped"),
    submit_request("stopped-2", "stopped"),
    submit_request("goes-1", "goes"),
    submit_request("goes-2", "goes"),
    submit_request("alone-recorded"),
    submit_request("alone"),
]
RECORDED = {0: REFUSED, 2: DELIVERED, 4: DELIVERED}


def submits_batcher() -> _Batcher[SubmitRequest, SubmitOutcome]:
    return _Batcher(
        DeliveryActivities.submit_items,
        lambda policy: "submits",
        lambda policy: 30.0,
        lambda message: SubmitOutcome(error_type=ItemErrorType.TRANSIENT, message=message),
        "submit",
        5,
        sequence_of=lambda request: request.sequence,
        went_through=went_through,
        untried=lambda: UNTRIED,
        withdrawable=True,
        recorded=lambda details, count: RECORDED if details == ["progress"] else {},
    )


async def test_a_batch_tried_again_sends_neither_what_was_recorded_nor_a_stopped_runs_rest() -> (
    None
):
    sent: list[str] = []

    async def start(rest: list[SubmitRequest]) -> list[SubmitOutcome]:
        sent.extend(request.item_id for request in rest)
        return [DELIVERED] * len(rest)

    answered = await submits_batcher()._try_again(RUNS, ["progress"], start)

    assert sent == ["goes-2", "alone"]
    assert answered == [REFUSED, UNTRIED, *[DELIVERED] * 4]


async def test_a_batch_whose_retry_fails_too_keeps_what_its_first_attempt_recorded() -> None:
    async def start(rest: list[SubmitRequest]) -> list[SubmitOutcome]:
        raise ActivityError(
            "worker lost",
            scheduled_event_id=9,
            started_event_id=10,
            identity="w",
            activity_type=SUBMIT_BATCH_ACTIVITY,
            activity_id="3",
            retry_state=RetryState.MAXIMUM_ATTEMPTS_REACHED,
        )

    answered = await submits_batcher()._try_again(RUNS, ["progress"], start)

    failed = SubmitOutcome(error_type=ItemErrorType.TRANSIENT, message="worker lost")
    # The recorded outcomes stand; what went again counts one failed request each.
    assert answered == [REFUSED, UNTRIED, DELIVERED, failed, DELIVERED, failed]
