"""A bulk destination that batches its submits and polls: its queues run `rate / batch`
activities a second, and the controls show and take rates in requests a second."""

from __future__ import annotations

import pytest
from durable_outbox_temporal.destinations import DestinationRegistry
from durable_outbox_temporal.errors import InvalidRequest

from flowcontrol.queue_rates import read_queue_rate
from service.destinations import DestinationControls
from tests.conftest import email_destination


async def test_the_queues_count_batches_and_the_controls_count_requests(
    stack_factory, fake_provider, dev_env
) -> None:
    destination = email_destination(
        fake_provider,
        mode="bulk",
        poll_batch=10,
        poll_rate=40.0,
        submit_batch=2,
        submit_rate=8.0,
    )
    stack = await stack_factory(destination, env=dev_env)
    controls = DestinationControls(
        stack.outbox, DestinationRegistry({destination.name: destination})
    )

    changed = await controls.update(destination.name, poll_rate=50.0, submit_rate=12.0)
    on_server = await read_queue_rate(stack.client, destination.poll_task_queue)
    submit_on_server = await read_queue_rate(stack.client, destination.submit_task_queue)
    paused = await controls.update(destination.name, paused=True, reason="maintenance")
    resumed = await controls.update(destination.name, paused=False)

    assert changed.poll.rate == 50.0 and on_server.rate == 5.0
    assert changed.submit.rate == 12.0 and submit_on_server.rate == 6.0
    assert paused.poll.paused and paused.poll.resume_rate == 50.0
    assert paused.submit.paused and paused.submit.resume_rate == 12.0
    assert resumed.poll.rate == 50.0 and not resumed.poll.paused
    assert resumed.submit.rate == 12.0 and not resumed.submit.paused
    assert (await read_queue_rate(stack.client, destination.poll_task_queue)).rate == 5.0
    # A rate under four batches a second would let the queue's partitions burst past it:
    # refused, nothing set.
    with pytest.raises(InvalidRequest, match="too low for the destination's submit_batch 2"):
        await controls.update(destination.name, submit_rate=7.0)
    assert (await read_queue_rate(stack.client, destination.submit_task_queue)).rate == 6.0


@pytest.mark.parametrize("kind", ["poll", "submit"])
def test_only_a_bulk_destination_batches(kind: str) -> None:
    with pytest.raises(ValueError, match=f"{kind}_batch: only a destination in bulk mode"):
        email_destination(_NoFake(), **{f"{kind}_batch": 10})


@pytest.mark.parametrize("kind", ["poll", "submit"])
def test_a_batch_must_fit_in_a_quarter_of_the_rate(kind: str) -> None:
    refused = rf"{kind}_batch 10 is more than {kind}_rate 39 allows \(9\)"
    with pytest.raises(ValueError, match=refused):
        email_destination(_NoFake(), mode="bulk", **{f"{kind}_batch": 10, f"{kind}_rate": 39.0})
    email_destination(_NoFake(), mode="bulk", **{f"{kind}_batch": 10, f"{kind}_rate": 40.0})


class _NoFake:
    url = "http://127.0.0.1:9"
