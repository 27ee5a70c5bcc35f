"""Destination controls at run time: rates and pause, enforced by the Temporal server, and the
flow-control rules changed at run time (breaker, caps, quotas), kept in the read model.

A pause is a zero rate limit on both of the destination's queues (`flowcontrol.queue_rates`; why:
docs/decisions/pause-as-zero-rate.md), so the server is the one source of truth for rates and
pauses. A flow rule's override is a row in the read model's database
(`readmodel.flow_overrides`), which every worker process reads again within seconds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
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
from contract.flow import (
    BREAKER_SETTINGS_SIGNAL,
    FLOW_QUERY,
    BreakerSettings,
    FlowState,
    flow_workflow_id,
)
from contract.item import POLICY_SETTINGS
from flowcontrol.caps import FlowLimits
from flowcontrol.policy import FlowPolicy
from flowcontrol.queue_rates import (
    MAX_REASON,
    QueueRate,
    pause_queue,
    read_queue_rate,
    set_queue_rate,
)
from outbox_client import OutboxClient, UnknownDestination
from outbox_client.errors import InvalidRequest
from readmodel.flow_overrides import FieldOverride, in_force, read_overrides, write_overrides
from readmodel.permits import permits_held, scopes_full, windows_full

# MAX_REASON and QueueRate are re-exported: the API validates and shows them.
__all__ = ["MAX_REASON", "DestinationControls", "DestinationState", "QueueRate"]

log = logging.getLogger("outbox.service")

_IDENTITY = "durable-outbox-api"
# A flow's query is answered by a worker; without one in this long the answer leaves it out.
_FLOW_QUERY_WAIT = timedelta(seconds=2)


@dataclass
class FlowPolicyInForce:
    """A destination's flow-control rules in force: the destinations file's, with the fields
    changed at run time (`overrides`) in place."""

    policy: FlowPolicy
    overrides: Mapping[str, FieldOverride] = field(default_factory=dict)

    def source(self, name: str) -> Literal["file", "api"]:
        """Where a field's value comes from: the destinations file (or its env), or the API."""
        return "api" if name in self.overrides else "file"


@dataclass
class DestinationState:
    """A destination's configuration and what the server enforces now."""

    destination: Destination
    submit: QueueRate
    poll: QueueRate
    # The throttle rule and the circuit at work (`flowcontrol.throttle`, `flowcontrol.breaker`),
    # when asked for and running.
    flow: FlowState | None = None
    # The flow-control rules in force, when asked for and the read model could say.
    flow_policy: FlowPolicyInForce | None = None
    # Requests out now under its `max_in_flight` (permits held, fleet-wide), when one is set.
    in_flight: int | None = None

    @property
    def paused(self) -> bool:
        return self.submit.paused or self.poll.paused

    @property
    def circuit(self) -> str:
        """ "open" while the destination's circuit holds its submits (`flowcontrol.breaker`)."""
        return "open" if self.submit.circuit_open_since is not None else "closed"


class DestinationControls:
    """Reads and changes the rates in force on each destination's task queues."""

    def __init__(
        self,
        outbox: OutboxClient,
        destinations: DestinationRegistry,
        engine: Engine | None = None,
    ) -> None:
        """`engine` is the read model, where flow rules changed at run time are kept (none:
        they cannot be changed)."""
        self._outbox = outbox
        self._destinations = destinations
        self._engine = engine

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
            state.flow_policy = await self._flow_policy_shown(destination)
            if state.flow_policy is not None:
                state.in_flight = await self._in_flight(name, state.flow_policy.policy)
        return state

    async def _in_flight(self, name: str, policy: FlowPolicy) -> int | None:
        """The permits of the destination's concurrency cap held now; None without a cap."""
        permits = FlowLimits(name).under(policy).permits(None)
        if self._engine is None or not permits:
            return None
        [(scope, _)] = permits
        try:
            return await asyncio.to_thread(permits_held, self._engine, scope, datetime.now(UTC))
        except SQLAlchemyError as err:
            log.warning("in flight at %s: the read model cannot say now (%s)", name, err)
            return None

    async def flow_policy(self, name: str) -> FlowPolicyInForce:
        """The destination's flow-control rules in force (raises if the read model cannot say)."""
        destination = self.destination(name)
        if self._engine is None:
            return FlowPolicyInForce(destination.flow)
        overrides = await asyncio.to_thread(read_overrides, self._engine, name)
        found = overrides.get(name, {})
        return FlowPolicyInForce(in_force(destination.flow, found), found)

    async def _flow_policy_shown(self, destination: Destination) -> FlowPolicyInForce | None:
        """As `flow_policy`, or None while the read model cannot say (a read never fails for
        it)."""
        try:
            return await self.flow_policy(destination.name)
        except SQLAlchemyError as err:
            log.warning("flow policy of %s: the read model cannot say now (%s)", destination, err)
            return None

    async def holding(self, name: str) -> list[str]:
        """The destination's caps and quotas that are full now (`flowcontrol/caps.py`), in
        words: what holds its items that wait for them; empty when the read model cannot say."""
        if self._engine is None:
            return []
        try:
            current = await self.flow_policy(name)
            limits = FlowLimits(name).under(current.policy)
            if not limits.active:
                return []
            now = datetime.now(UTC)
            full = await asyncio.to_thread(
                scopes_full, self._engine, limits.permits(None), limits.key_permits(), now
            )
            full += await asyncio.to_thread(
                windows_full, self._engine, limits.submits(None), limits.key_submits(), now
            )
        except SQLAlchemyError as err:
            log.warning("caps of %s: the read model cannot say now (%s)", name, err)
            return []
        return [limits.holding_scope(scope) for scope in full]

    async def _store_flow(self, destination: Destination, changes: Mapping[str, Any]) -> None:
        assert self._engine is not None
        await asyncio.to_thread(
            write_overrides, self._engine, destination.name, changes, datetime.now(UTC)
        )

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
        flow: Mapping[str, Any] | None = None,
    ) -> DestinationState:
        """Set rates and/or pause or resume; a rate set while paused applies on resume. `flow`
        changes flow-control fields (a None value: back to the file's), stored once the rates
        are set, so a refused request changes nothing."""
        if reason is not None and len(reason) > MAX_REASON:
            raise InvalidRequest(f"reason longer than {MAX_REASON} characters")
        destination = self.destination(name)
        if flow and self._engine is None:
            raise InvalidRequest("flow rules cannot change at run time without the read model")
        if flow or (submit_rate is not None and destination.lane_run > 1):
            # Validated before any rate is set: a bad value changes nothing. A lane's runs are
            # held to the submit rate by a quota, so a lower rate is checked against it too.
            current = await self.flow_policy(name)
            merged = {n: found.value for n, found in current.overrides.items()} | dict(flow or {})
            _with_flow(
                destination,
                destination.flow.overridden({n: v for n, v in merged.items() if v is not None}),
                submit_rate=submit_rate,
            )
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
        state = await self.state(name)
        if flow:
            await self._store_flow(destination, flow)
            state.flow_policy = await self.flow_policy(name)
            if any(field.startswith("breaker") for field in flow):
                await self._tell_flow(destination, state.flow_policy.policy)
        return state

    async def _tell_flow(self, destination: Destination, policy: FlowPolicy) -> None:
        """Give a running flow workflow the breaker settings now in force, so a circuit open
        now follows them (a breaker turned off closes it); with none running, nothing is
        open and the next failing report carries them."""
        client = await self._outbox.temporal()
        handle = client.get_workflow_handle(flow_workflow_id(destination.name))
        settings = BreakerSettings(
            enabled=policy.breaker,
            probe_interval_s=policy.breaker_probe_interval_s,
            close_after=policy.breaker_close_after,
        )
        try:
            await handle.signal(BREAKER_SETTINGS_SIGNAL, settings)
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise


def _with_flow(
    destination: Destination, policy: FlowPolicy, *, submit_rate: float | None = None
) -> Destination:
    """The destination with `policy` as its flow table (and `submit_rate`, if given), validated
    as the destinations file is: a policy its mode cannot honour (a lane running several items
    per submit activity without a quota holding them to the rate, say) raises pydantic's
    ValidationError saying why."""
    fields = destination.model_dump(exclude={"delivery", "flow"})
    fields.update({name: getattr(destination.delivery, name) for name in POLICY_SETTINGS})
    fields["flow"] = policy.model_dump()
    if submit_rate is not None:
        fields["submit_rate"] = submit_rate
    return Destination.model_validate(fields)


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
            # The server keeps a rate as a float32: 0.001 reads back as 0.0010000000474974513.
            else (rate.source == "api" and math.isclose(rate.rate, want, rel_tol=1e-6))
            for rate, want in zip(rates, stored.values(), strict=True)
        ):
            return
        await asyncio.sleep(0.05)
