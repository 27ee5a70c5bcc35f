"""Destination controls at run time: rates and pause, enforced by the Temporal server, and the
flow-control rules changed at run time (breaker, caps, quotas), kept in the read model.

A pause is a zero rate limit on both of the destination's queues (`flowcontrol.queue_rates`; why:
docs/decisions/pause-as-zero-rate.md), so the server is the one source of truth for rates and
pauses. A flow rule's override is a row in the read model's database
(`readmodel.flow_overrides`), which every worker process reads again within seconds.

A change reads both queues, then updates one after the other: two changes at once (two API
processes, say) could interleave and leave one queue paused and the other running. So a change
holds its destination for its whole read-update-read, in this process and, through a lease in
the read model (`readmodel.locks`), in every API process; and a change refused by the server
after one queue changed asks again for a while, then puts that queue back. Why:
docs/decisions/destination-controls-lease.md
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Literal, TypeVar

from durable_outbox_temporal import OutboxClient, UnknownDestination
from durable_outbox_temporal.contract.flow import (
    BREAKER_SETTINGS_SIGNAL,
    FLOW_QUERY,
    BreakerSettings,
    FlowState,
    flow_workflow_id,
)
from durable_outbox_temporal.contract.flow_policy import FlowPolicy
from durable_outbox_temporal.contract.item import POLICY_SETTINGS
from durable_outbox_temporal.destinations import (
    BATCH_RULE,
    Destination,
    DestinationRegistry,
    max_batch,
    poll_queue_requests,
)
from durable_outbox_temporal.errors import (
    InvalidRequest,
    TemporalUnavailable,
    is_temporal_unavailable,
)
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from temporalio.client import Client, RPCTimeoutOrCancelledError, WorkflowQueryRejectedError
from temporalio.common import QueryRejectCondition
from temporalio.service import RPCError, RPCStatusCode

from flowcontrol.caps import FlowLimits
from flowcontrol.queue_rates import (
    MAX_REASON,
    QueueRate,
    disabled_reason,
    pause_queue,
    read_queue_rate,
    restore_queue,
    set_queue_rate,
)
from readmodel.flow_overrides import FieldOverride, in_force, read_overrides, write_overrides
from readmodel.locks import LockBusy, held
from readmodel.permits import permits_held, scopes_full, windows_full

# MAX_REASON and QueueRate are re-exported: the API validates and shows them.
__all__ = ["MAX_REASON", "DestinationControls", "DestinationState", "QueueRate"]

log = logging.getLogger("outbox.service")

_IDENTITY = "durable-outbox-api"
# A flow's query is answered by a worker; without one in this long the answer leaves it out.
_FLOW_QUERY_WAIT = timedelta(seconds=2)
# A change holds its destination's lease at most this long (each of its calls to the server is
# cut at `_CALL_TIMEOUT`, its retries at `_RETRY_FOR_S`: it ends well within it). A change
# waits for the lease longer than that, so a holder that died never refuses one.
_LEASE = timedelta(seconds=60)
_LEASE_WAIT = timedelta(seconds=65)
_CALL_TIMEOUT = timedelta(seconds=5)
# The server refuses an update under load (RESOURCE_EXHAUSTED, saying no time to wait): the
# second queue's update is asked again, backing off from `_RETRY_FIRST_S`, for this long.
_RETRY_FOR_S = 5.0
_RETRY_FIRST_S = 0.2

T = TypeVar("T")


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

    @property
    def disabled(self) -> bool:
        """Disabled after failing too long, or by hand (`flowcontrol.disable`)."""
        return self.submit.disabled_since is not None


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
        # One change at a time per destination in this process (the lease holds the others).
        self._changing_now: dict[str, asyncio.Lock] = {}

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
            # Cancelled: the server gave up on it under load, as on one that timed out.
            if err.status in (
                RPCStatusCode.NOT_FOUND,
                RPCStatusCode.DEADLINE_EXCEEDED,
                RPCStatusCode.CANCELLED,
            ):
                return None
            raise
        return flow

    async def _queue_rates(
        self, destination: Destination, rpc_timeout: timedelta | None = None
    ) -> tuple[QueueRate, QueueRate]:
        """The submit and poll queues' rates as the server holds them, in activities."""
        client = await self._outbox.temporal()
        submit, poll = await asyncio.gather(
            read_queue_rate(client, destination.submit_task_queue, rpc_timeout=rpc_timeout),
            read_queue_rate(client, destination.poll_task_queue, rpc_timeout=rpc_timeout),
        )
        return submit, poll

    @contextlib.asynccontextmanager
    async def _changing(self, destination: Destination) -> AsyncIterator[None]:
        """Hold the destination against every other change to it: this process's, and with the
        read model every API process's (without one, the API must run as one process). A read
        model that does not answer refuses the change (503): nothing is changed then."""
        async with self._changing_now.setdefault(destination.name, asyncio.Lock()):
            if self._engine is None:
                yield
                return
            scope = f"controls/{destination.name}"
            try:
                async with held(self._engine, scope, lease=_LEASE, wait=_LEASE_WAIT):
                    yield
            except LockBusy as err:
                log.warning("change to %s refused: %s", destination, err)
                raise TemporalUnavailable(
                    f"other changes to destination {destination.name!r} kept it; retry later"
                ) from err

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
        enabled: bool | None = None,
    ) -> DestinationState:
        """Set rates and/or pause or resume; a rate set while paused applies on resume. `flow`
        changes flow-control fields (a None value: back to the file's), stored once the rates
        are set, so a refused request changes nothing. `enabled` re-enables a disabled
        destination (true) or disables it by hand (false; `flowcontrol.disable`).

        Both queues change, or neither: one change at a time per destination across every API
        process, run to its end even if the request is cancelled meanwhile."""
        if reason is not None and len(reason) > MAX_REASON:
            raise InvalidRequest(f"reason longer than {MAX_REASON} characters")
        if enabled is not None and paused is not None and enabled == paused:
            raise InvalidRequest(
                f"enabled: {str(enabled).lower()} and paused: {str(paused).lower()} contradict"
                " each other: give one"
            )
        destination = self.destination(name)
        if flow and self._engine is None:
            raise InvalidRequest("flow rules cannot change at run time without the read model")
        return await _to_the_end(
            self._update(
                destination,
                submit_rate=submit_rate,
                poll_rate=poll_rate,
                paused=paused,
                reason=reason,
                flow=flow,
                enabled=enabled,
            )
        )

    async def _update(
        self,
        destination: Destination,
        *,
        submit_rate: float | None,
        poll_rate: float | None,
        paused: bool | None,
        reason: str | None,
        flow: Mapping[str, Any] | None,
        enabled: bool | None,
    ) -> DestinationState:
        name = destination.name
        async with self._changing(destination):
            if flow or (submit_rate is not None and destination.lane_run > 1):
                # Validated before any rate is set: a bad value changes nothing. A lane's runs
                # are held to the submit rate by a quota, so a lower rate is checked against it.
                current = await self.flow_policy(name)
                merged = {n: found.value for n, found in current.overrides.items()} | dict(
                    flow or {}
                )
                _with_flow(
                    destination,
                    destination.flow.overridden({n: v for n, v in merged.items() if v is not None}),
                    submit_rate=submit_rate,
                )
            now_submit, now_poll = await self._queue_rates(destination, _CALL_TIMEOUT)
            client = await self._outbox.temporal()
            changes = _queue_changes(
                client,
                destination,
                now_submit,
                now_poll,
                submit_rate=submit_rate,
                poll_rate=poll_rate,
                paused=paused,
                reason=reason,
                enabled=enabled,
            )
            await _apply(client, changes)
            await _until_stored(client, {change.queue: change.stored for change in changes})
            state = await self.state(name)
            if flow:
                await self._store_flow(destination, flow)
                state.flow_policy = await self.flow_policy(name)
                if any(field.startswith(("breaker", "disable")) for field in flow):
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
            disable_after_s=policy.disabling_after_s,
        )
        try:
            await handle.signal(BREAKER_SETTINGS_SIGNAL, settings)
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise


@dataclass
class _QueueChange:
    """One queue's update in a change, what it is to read back after, and how it was before."""

    queue: str
    before: QueueRate
    write: Callable[[], Awaitable[None]]
    # The limit it is to read back (None: the workers' rate).
    stored: float | None


def _queue_changes(
    client: Client,
    destination: Destination,
    now_submit: QueueRate,
    now_poll: QueueRate,
    *,
    submit_rate: float | None,
    poll_rate: float | None,
    paused: bool | None,
    reason: str | None,
    enabled: bool | None = None,
) -> list[_QueueChange]:
    """The updates that bring the destination's queues from how they are now to the rates and
    pause (and `enabled`: the submit queue's disable) asked for (raises InvalidRequest for rates
    it cannot run at)."""
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
    changes = []
    for queue, now, new_rate in (
        (
            destination.submit_task_queue,
            now_submit,
            None if submit_rate is None else submit_rate / destination.submit_batch,
        ),
        (destination.poll_task_queue, now_poll, new_poll_queue),
    ):
        pause = now.paused if paused is None else paused
        # A pause's reason, or a resume's; with `enabled` only, it is the disable's.
        said = reason if paused is not None else None
        disable = enabled is False and queue == destination.submit_task_queue
        re_enable = enabled is True and now.disabled_since is not None
        stored: float | None
        if disable or (pause and not re_enable):
            if disable and now.disabled_since is None:
                text = disabled_reason(
                    datetime.now(UTC), "by request" + (f": {reason}" if reason else "")
                )
            elif disable:
                text = now.pause_reason or "disabled"
            else:
                text = said if said is not None else (now.pause_reason or "paused by request")
            stored = 0.0
            write = partial(
                pause_queue,
                client,
                queue,
                now,
                text,
                identity=_IDENTITY,
                resume_rate=new_rate,
                rpc_timeout=_CALL_TIMEOUT,
            )
        elif now.paused or new_rate is not None:
            if now.paused:
                stored = new_rate if new_rate is not None else now.resume_rate
                text = (
                    f"re-enabled: {reason or 'by request'}"
                    if re_enable
                    else f"resumed: {said or 'by request'}"
                )
            else:
                stored, text = new_rate, said or "rate set by request"
            write = partial(
                set_queue_rate,
                client,
                queue,
                stored,
                text,
                identity=_IDENTITY,
                rpc_timeout=_CALL_TIMEOUT,
            )
        else:
            continue
        changes.append(_QueueChange(queue, now, write, stored))
    return changes


async def _apply(client: Client, changes: list[_QueueChange]) -> None:
    """Make each queue's update, all or none. An update refused once one has been made is asked
    again for a while (the server refuses them under load); still refused, the queues updated
    are put back as they were and the refusal raised: the caller answers it (503, retry later)
    with nothing changed."""
    for index, change in enumerate(changes):
        try:
            if index == 0:
                await change.write()
            else:
                await _again_while_refused(change.write)
        except (RPCError, RPCTimeoutOrCancelledError) as err:
            # A call cut short may have been made all the same.
            made = changes[:index] + ([change] if _maybe_made(err) else [])
            if made:
                log.warning(
                    "%s not updated (%s): putting back %s",
                    change.queue,
                    err,
                    ", ".join(done.queue for done in made),
                )
                await _put_back(client, made)
            raise


async def _put_back(client: Client, changes: list[_QueueChange]) -> None:
    """Put each queue back as it was before the change (asked again while refused)."""
    restored: dict[str, float | None] = {}
    for change in reversed(changes):
        before = change.before
        try:
            await _again_while_refused(
                partial(
                    restore_queue,
                    client,
                    change.queue,
                    before,
                    identity=_IDENTITY,
                    rpc_timeout=_CALL_TIMEOUT,
                )
            )
        except (RPCError, RPCTimeoutOrCancelledError) as err:
            # Left changed: the destination reads as paused if either queue is, and the next
            # change (the refused request sent again) sets both.
            log.error("%s could not be put back (%s): it stays as changed", change.queue, err)
            continue
        restored[change.queue] = (
            0.0 if before.paused else (before.rate if before.source == "api" else None)
        )
    await _until_stored(client, restored)


def _maybe_made(err: RPCError | RPCTimeoutOrCancelledError) -> bool:
    """Whether a call that raised `err` may have been made all the same (its answer lost)."""
    return isinstance(err, RPCTimeoutOrCancelledError) or err.status in (
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.CANCELLED,
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.UNKNOWN,
    )


async def _again_while_refused(call: Callable[[], Awaitable[None]]) -> None:
    """Make `call`, again while the server refuses it or does not answer, backing off, for up
    to `_RETRY_FOR_S`; raises its last error past that."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _RETRY_FOR_S
    delay = _RETRY_FIRST_S
    while True:
        try:
            await call()
            return
        except (RPCError, RPCTimeoutOrCancelledError) as err:
            retry_later = is_temporal_unavailable(err) or (
                isinstance(err, RPCError) and err.status == RPCStatusCode.CANCELLED
            )
            if not retry_later or loop.time() + delay > deadline:
                raise
            log.info("queue update refused (%s): asking again in %g s", err, delay)
        await asyncio.sleep(delay)
        delay *= 2


async def _to_the_end(work: Coroutine[Any, Any, T]) -> T:
    """Run `work` to its end even if the caller is cancelled meanwhile (a client gone): a change
    cut between its two queues' updates would leave them split."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        # Its outcome is nobody's now; retrieved, so it is not reported as lost.
        task.add_done_callback(lambda done: done.cancelled() or done.exception())
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
        rates = await asyncio.gather(
            *(read_queue_rate(client, queue, rpc_timeout=_CALL_TIMEOUT) for queue in stored)
        )
        if all(
            (rate.source == "worker")
            if want is None
            # The server keeps a rate as a float32: 0.001 reads back as 0.0010000000474974513.
            else (rate.source == "api" and math.isclose(rate.rate, want, rel_tol=1e-6))
            for rate, want in zip(rates, stored.values(), strict=True)
        ):
            return
        await asyncio.sleep(0.05)
