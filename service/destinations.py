"""Destination controls at run time: rates and pause, enforced by the Temporal server.

A pause is a zero rate limit on both of the destination's queues (`flowcontrol.queue_rates`; why:
docs/decisions/pause-as-zero-rate.md), so the server is the one source of truth for rates and
pauses.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from datetime import timedelta

from temporalio.client import Client, RPCTimeoutOrCancelledError, WorkflowQueryRejectedError
from temporalio.common import QueryRejectCondition
from temporalio.service import RPCError, RPCStatusCode

from common.destinations import (
    BATCH_RULE,
    Destination,
    DestinationRegistry,
    max_batch,
    poll_queue_requests,
)
from contract.flow import FLOW_QUERY, FlowState, flow_workflow_id
from flowcontrol.queue_rates import (
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
# A flow's query is answered by a worker; without one in this long the answer leaves it out.
_FLOW_QUERY_WAIT = timedelta(seconds=2)


@dataclass
class DestinationState:
    """A destination's configuration and what the server enforces now."""

    destination: Destination
    submit: QueueRate
    poll: QueueRate
    # The throttle rule and the circuit at work (`flowcontrol.throttle`, `flowcontrol.breaker`),
    # when asked for and running.
    flow: FlowState | None = None

    @property
    def paused(self) -> bool:
        return self.submit.paused or self.poll.paused

    @property
    def circuit(self) -> str:
        """ "open" while the destination's circuit holds its submits (`flowcontrol.breaker`)."""
        return "open" if self.submit.circuit_open_since is not None else "closed"


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

    async def state(self, name: str, *, with_flow: bool = False) -> DestinationState:
        destination = self.destination(name)
        state = _in_requests(destination, *await self._queue_rates(destination))
        if with_flow:
            state.flow = await self._flow(destination)
        return state

    async def _flow(self, destination: Destination) -> FlowState | None:
        """The destination's flow workflow's state, if one is running (a query: a worker
        answers it; a busy or absent one leaves the field empty rather than fail the read)."""
        client = await self._outbox.temporal()
        handle = client.get_workflow_handle(flow_workflow_id(destination.name))
        try:
            flow: FlowState = await handle.query(
                FLOW_QUERY,
                result_type=FlowState,
                reject_condition=QueryRejectCondition.NOT_OPEN,
                rpc_timeout=_FLOW_QUERY_WAIT,
            )
        except (WorkflowQueryRejectedError, RPCTimeoutOrCancelledError):
            return None
        except RPCError as err:
            if err.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.DEADLINE_EXCEEDED):
                return None
            raise
        return flow

    async def _queue_rates(self, destination: Destination) -> tuple[QueueRate, QueueRate]:
        """The submit and poll queues' rates as the server holds them, in activities."""
        client = await self._outbox.temporal()
        submit, poll = await asyncio.gather(
            read_queue_rate(client, destination.submit_task_queue),
            read_queue_rate(client, destination.poll_task_queue),
        )
        return submit, poll

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
        destination = self.destination(name)
        now_submit, now_poll = await self._queue_rates(destination)
        client = await self._outbox.temporal()
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
        new_poll_queue = None if poll_rate is None else poll_rate / destination.poll_batch
        if destination.poll_in_submit and (submit_rate is not None or poll_rate is not None):
            # The poll queue leaves room for the first polls the submits make: a new submit rate
            # moves it too.
            shown = _in_requests(destination, now_submit, now_poll)
            submits = _running(shown.submit, destination.submit_rate, submit_rate)
            polls = _running(shown.poll, destination.poll_rate, poll_rate)
            if polls <= submits:
                raise InvalidRequest(
                    f"poll_rate {polls:g} must stay above submit_rate {submits:g}: the"
                    " destination polls in its submits (poll_in_submit), so the poll queue runs"
                    " poll_rate - submit_rate"
                )
            new_poll_queue = poll_queue_requests(polls, submits, poll_in_submit=True)
        stored: dict[str, float | None] = {}
        for queue, now, new_rate in (
            (
                destination.submit_task_queue,
                now_submit,
                None if submit_rate is None else submit_rate / destination.submit_batch,
            ),
            (destination.poll_task_queue, now_poll, new_poll_queue),
        ):
            pause = now.paused if paused is None else paused
            if pause:
                text = reason if reason is not None else (now.pause_reason or "paused by request")
                await pause_queue(
                    client, queue, now, text, identity=_IDENTITY, resume_rate=new_rate
                )
                stored[queue] = 0.0
            elif now.paused:
                rate = new_rate if new_rate is not None else now.resume_rate
                await set_queue_rate(
                    client, queue, rate, f"resumed: {reason or 'by request'}", identity=_IDENTITY
                )
                stored[queue] = rate
            elif new_rate is not None:
                await set_queue_rate(
                    client, queue, new_rate, reason or "rate set by request", identity=_IDENTITY
                )
                stored[queue] = new_rate
        await _until_stored(client, stored)
        return await self.state(name)


def _in_requests(destination: Destination, submit: QueueRate, poll: QueueRate) -> DestinationState:
    """The destination's state in requests a second, from its queues' rates in activities: a
    batching destination's activities carry `batch` requests each, and a `poll_in_submit`
    destination's submits make a poll each on top of its poll queue's."""
    submits = _per_batch(submit, destination.submit_batch)
    polls = _per_batch(poll, destination.poll_batch)
    if destination.poll_in_submit:
        resumes = (polls.resume_rate, submits.resume_rate)
        polls = dataclasses.replace(
            polls,
            rate=polls.rate + submits.rate,
            # None: a resume restores the configured rates.
            resume_rate=None
            if resumes == (None, None)
            else (polls.resume_rate or destination.poll_queue_rate)
            + (submits.resume_rate or destination.submit_rate),
        )
    return DestinationState(destination=destination, submit=submits, poll=polls)


def _running(shown: QueueRate, configured: float, new: float | None) -> float:
    """The rate in requests a second a queue is to run at: `new` if given, else the one it runs
    at now (or resumes at, while paused)."""
    if new is not None:
        return new
    if shown.paused:
        return shown.resume_rate if shown.resume_rate is not None else configured
    return shown.rate


def _per_batch(rate: QueueRate, batch: float) -> QueueRate:
    """A queue's rate in requests a second from its rate in activities (`batch` requests each)."""
    if batch == 1:
        return rate
    return dataclasses.replace(
        rate,
        rate=rate.rate * batch,
        resume_rate=None if rate.resume_rate is None else rate.resume_rate * batch,
    )


# How long an answer waits for the server to show the limits it was just given.
_STORED_WAIT_S = 2.0


async def _until_stored(client: Client, stored: dict[str, float | None]) -> None:
    """Wait (briefly) until each queue reads back the limit just set: under load, a describe
    right after an update has been seen to return the one before it (a resume answered with its
    queue still paused), and the answer shows what is in force."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _STORED_WAIT_S
    while stored and loop.time() < deadline:
        rates = await asyncio.gather(*(read_queue_rate(client, queue) for queue in stored))
        if all(
            (rate.source == "worker")
            if want is None
            else (rate.source == "api" and rate.rate == want)
            for rate, want in zip(rates, stored.values(), strict=True)
        ):
            return
        await asyncio.sleep(0.05)
