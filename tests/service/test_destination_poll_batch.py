"""A bulk destination that batches its polls: its poll queue runs `poll_rate / poll_batch`
activities a second, and the controls show and take rates in polls a second."""

from __future__ import annotations

from common.destinations import DestinationRegistry
from common.queue_rates import read_queue_rate
from service.destinations import DestinationControls
from tests.conftest import email_destination


async def test_the_poll_queue_counts_batches_and_the_controls_count_polls(
    stack_factory, fake_provider, dev_env
) -> None:
    destination = email_destination(
        fake_provider, mode="bulk", poll_batch=10, poll_rate=20.0, submit_rate=5.0
    )
    stack = await stack_factory(destination, env=dev_env)
    controls = DestinationControls(
        stack.outbox, DestinationRegistry({destination.name: destination})
    )

    changed = await controls.update(destination.name, poll_rate=50.0)
    on_server = await read_queue_rate(stack.client, destination.poll_task_queue)
    paused = await controls.update(destination.name, paused=True, reason="maintenance")
    resumed = await controls.update(destination.name, paused=False)

    assert changed.poll.rate == 50.0 and on_server.rate == 5.0
    assert paused.poll.paused and paused.poll.resume_rate == 50.0
    assert resumed.poll.rate == 50.0 and not resumed.poll.paused
    assert (await read_queue_rate(stack.client, destination.poll_task_queue)).rate == 5.0


def test_only_a_bulk_destination_batches_its_polls() -> None:
    try:
        email_destination(_NoFake(), poll_batch=10)
    except ValueError as err:
        assert "bulk mode" in str(err)
    else:
        raise AssertionError("an item-mode destination took poll_batch")


class _NoFake:
    url = "http://127.0.0.1:9"
