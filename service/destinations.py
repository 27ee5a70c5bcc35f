"""Destination controls at run time: rates and pause, enforced by the Temporal server.

Measured on this dev server (server 1.32, SDK 1.35), see the README's "Operating":
`UpdateTaskQueueConfig` on an activity task queue sets a queue rate limit that overrides the
rate the workers ask for (`max_task_queue_activities_per_second`), across every worker, and is
kept in Temporal's own database, so it survives restarts of every process. A limit of 0 stops
dispatch altogether: activities in flight finish, scheduled ones wait, nothing fails. Unsetting
it returns the queue to the workers' (configured) rate. So a pause is a zero limit on both of the
destination's queues, and the server is the one source of truth for rates and pauses.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from temporalio.api.enums.v1 import RateLimitSource, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    DescribeTaskQueueRequest,
    UpdateTaskQueueConfigRequest,
)
from temporalio.client import Client

from common.destinations import Destination, DestinationRegistry
from outbox_client import OutboxClient, UnknownDestination
from outbox_client.errors import InvalidRequest

_IDENTITY = "durable-outbox-api"
# A paused queue's limit reason records the run-time rate to restore on resume, if there was one.
_PAUSED = re.compile(r"^paused; resume at (?P<rate>[0-9.]+|configured)/s; (?P<reason>.*)$", re.S)
MAX_REASON = 500


@dataclass
class QueueRate:
    """The rate a task queue is held to now, and who set it."""

    rate: float
    # "api" (set at run time; 0 while paused) or "worker" (the destinations file's rate).
    source: str
    paused: bool = False
    pause_reason: str | None = None
    resume_rate: float | None = None


@dataclass
class DestinationState:
    """A destination's configuration and what the server enforces now."""

    destination: Destination
    submit: QueueRate
    poll: QueueRate

    @property
    def paused(self) -> bool:
        return self.submit.paused or self.poll.paused


class DestinationControls:
    """Reads and changes the rates in force on each destination's task queues."""

    def __init__(self, outbox: OutboxClient, destinations: DestinationRegistry) -> None:
        self._outbox = outbox
        self._destinations = destinations

    def destination(self, name: str) -> Destination:
        found = self._destinations.get(name)
        if found is None:
            raise UnknownDestination(f"no destination {name!r}")
        return found

    async def state(self, name: str) -> DestinationState:
        destination = self.destination(name)
        client = await self._outbox.temporal()
        submit, poll = await asyncio.gather(
            _queue_rate(client, destination.submit_task_queue),
            _queue_rate(client, destination.poll_task_queue),
        )
        return DestinationState(destination=destination, submit=submit, poll=poll)

    async def states(self) -> list[DestinationState]:
        return list(await asyncio.gather(*map(self.state, self._destinations.names)))

    async def update(
        self,
        name: str,
        *,
        submit_rate: float | None = None,
        poll_rate: float | None = None,
        paused: bool | None = None,
        reason: str | None = None,
    ) -> DestinationState:
        """Set rates and/or pause or resume; a rate set while paused applies on resume."""
        if reason is not None and len(reason) > MAX_REASON:
            raise InvalidRequest(f"reason longer than {MAX_REASON} characters")
        current = await self.state(name)
        client = await self._outbox.temporal()
        destination = current.destination
        for queue, now, new_rate in (
            (destination.submit_task_queue, current.submit, submit_rate),
            (destination.poll_task_queue, current.poll, poll_rate),
        ):
            pause = now.paused if paused is None else paused
            if pause:
                resume_rate = new_rate if new_rate is not None else now.resume_rate
                if not now.paused and new_rate is None and now.source == "api":
                    resume_rate = now.rate  # pausing: remember the run-time rate
                text = reason if reason is not None else (now.pause_reason or "paused by request")
                await _set_rate(client, queue, 0.0, _pause_reason(resume_rate, text))
            elif now.paused:
                rate = new_rate if new_rate is not None else now.resume_rate
                await _set_rate(client, queue, rate, f"resumed: {reason or 'by request'}")
            elif new_rate is not None:
                await _set_rate(client, queue, new_rate, reason or "rate set by request")
        return await self.state(name)


def _pause_reason(resume_rate: float | None, reason: str) -> str:
    rate = "configured" if resume_rate is None else f"{resume_rate:g}"
    return f"paused; resume at {rate}/s; {reason}"


async def _set_rate(client: Client, task_queue: str, rate: float | None, reason: str) -> None:
    """Set (or with None, unset: back to the workers' rate) the queue's rate limit."""
    request = UpdateTaskQueueConfigRequest(
        namespace=client.namespace,
        identity=_IDENTITY,
        task_queue=task_queue,
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
    )
    request.update_queue_rate_limit.reason = reason
    if rate is not None:
        request.update_queue_rate_limit.rate_limit.requests_per_second = rate
    await client.workflow_service.update_task_queue_config(request)


async def _queue_rate(client: Client, task_queue: str) -> QueueRate:
    response = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
            report_config=True,
        )
    )
    effective = response.effective_rate_limit
    from_api = effective.rate_limit_source == RateLimitSource.RATE_LIMIT_SOURCE_API
    queue_limit = response.config.queue_rate_limit
    paused = (
        from_api
        and queue_limit.HasField("rate_limit")
        and (queue_limit.rate_limit.requests_per_second == 0)
    )
    rate = QueueRate(
        rate=effective.requests_per_second, source="api" if from_api else "worker", paused=paused
    )
    if paused:
        match = _PAUSED.match(queue_limit.metadata.reason)
        if match:
            rate.pause_reason = match["reason"]
            rate.resume_rate = None if match["rate"] == "configured" else float(match["rate"])
        else:
            rate.pause_reason = queue_limit.metadata.reason or "paused"
    return rate
