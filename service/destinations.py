"""Destination controls at run time: rates and pause, enforced by the Temporal server.

A pause is a zero rate limit on both of the destination's queues (see `common.queue_rates` for
what was measured), so the server is the one source of truth for rates and pauses.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass

from common.destinations import BATCH_RULE, Destination, DestinationRegistry, max_batch
from common.queue_rates import (
    MAX_REASON,
    QueueRate,
    pause_queue,
    read_queue_rate,
    set_queue_rate,
)
from outbox_client import OutboxClient, UnknownDestination
from outbox_client.errors import InvalidRequest

# MAX_REASON and QueueRate are re-exported: the API validates and shows them.
__all__ = ["MAX_REASON", "DestinationControls", "DestinationState", "QueueRate"]

_IDENTITY = "durable-outbox-api"


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
            read_queue_rate(client, destination.submit_task_queue),
            read_queue_rate(client, destination.poll_task_queue),
        )
        # Shown in requests a second: a batching destination's queues count batches.
        return DestinationState(
            destination=destination,
            submit=_per_batch(submit, destination.submit_batch),
            poll=_per_batch(poll, destination.poll_batch),
        )

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
        for kind, rate, batch in (
            ("submit", submit_rate, destination.submit_batch),
            ("poll", poll_rate, destination.poll_batch),
        ):
            if rate is not None and batch > max_batch(rate):
                raise InvalidRequest(
                    f"{kind}_rate {rate:g} is too low for the destination's {kind}_batch"
                    f" {batch}: {BATCH_RULE}"
                )
        # The queues count activities; a batching destination's activities carry `batch` each.
        for queue, now, new_rate in (
            (
                destination.submit_task_queue,
                _per_batch(current.submit, 1 / destination.submit_batch),
                None if submit_rate is None else submit_rate / destination.submit_batch,
            ),
            (
                destination.poll_task_queue,
                _per_batch(current.poll, 1 / destination.poll_batch),
                None if poll_rate is None else poll_rate / destination.poll_batch,
            ),
        ):
            pause = now.paused if paused is None else paused
            if pause:
                text = reason if reason is not None else (now.pause_reason or "paused by request")
                await pause_queue(
                    client, queue, now, text, identity=_IDENTITY, resume_rate=new_rate
                )
            elif now.paused:
                rate = new_rate if new_rate is not None else now.resume_rate
                await set_queue_rate(
                    client, queue, rate, f"resumed: {reason or 'by request'}", identity=_IDENTITY
                )
            elif new_rate is not None:
                await set_queue_rate(
                    client, queue, new_rate, reason or "rate set by request", identity=_IDENTITY
                )
        return await self.state(name)


def _per_batch(rate: QueueRate, batch: float) -> QueueRate:
    """A queue's rate in requests a second from its rate in activities (`batch` requests each),
    or back with `1 / batch`."""
    if batch == 1:
        return rate
    return dataclasses.replace(
        rate,
        rate=rate.rate * batch,
        resume_rate=None if rate.resume_rate is None else rate.resume_rate * batch,
    )
