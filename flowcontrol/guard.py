"""The one guard every submit and poll of a worker process goes through: the flow-control rules
that act around a request to a provider, in the order they apply, built in one place from the
destinations' policies (`FlowGuard.for_destinations`).

Before the request: the throttle's pause this process knows of (`throttle`), this process's
pacing at the queue's rate, most urgent first (`pacing`, `priority`), and the caps' permits and
the quotas' windows (`caps`). After it: its HTTP exchanges handed to the attempt log, which
writes them in batches off the request's path (`readmodel/attempts.py`), the permits given
back, and a submit's outcome counted by the throttle and breaker rules, which tell the
destination's flow workflow (`throttle`, `breaker`), and by the adaptive rate (`adaptive`). A
rule that does not apply to a destination lets its requests straight through; a process without
the read model's database gets rules that count nothing there (`NoCapsGate`, `NoAttemptLog`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from durable_outbox_temporal.contract.flow import (
    FAILING_SIGNAL,
    FLOW_WORKFLOW_TYPE,
    SUBMIT_OUTCOMES_SIGNAL,
    THROTTLED_SIGNAL,
    Failing,
    FlowState,
    SubmitOutcomes,
    Throttled,
    flow_workflow_id,
)
from durable_outbox_temporal.contract.flow_policy import FlowPolicy
from durable_outbox_temporal.contract.ids import poll_task_queue, submit_task_queue
from durable_outbox_temporal.contract.item import (
    DeliveryErrorDetails,
    ItemErrorType,
    PollRequest,
    SubmitRequest,
)
from sqlalchemy import Engine
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.service import RPCError, RPCStatusCode

from flowcontrol.adaptive import AdaptiveMeter, adaptive_queues
from flowcontrol.breaker import BreakerGate, breaker_queues, is_failure
from flowcontrol.caps import CapsGate, Held, NoCapsGate, RequestGate, flow_limits
from flowcontrol.pacing import RequestPacer, paced_queues, server_rate_reader
from flowcontrol.queue_rates import read_queue_rate, throttle_queue
from flowcontrol.throttle import ThrottleGate, throttled_queues
from readmodel import attempts
from readmodel.flow_overrides import FlowPolicies

if TYPE_CHECKING:
    from durable_outbox_temporal.destinations import Destination


class AttemptSink(Protocol):
    """Where the guard hands each request's HTTP exchanges (`readmodel.attempts.AttemptLog`)."""

    def add(self, item_id: str, made: Sequence[attempts.Attempt]) -> None: ...


class NoAttemptLog:
    """The attempt log of a process without the read model's database: it keeps nothing."""

    def add(self, item_id: str, made: Sequence[attempts.Attempt]) -> None:
        """Nowhere to write them."""


class FlowGuard:
    """The flow-control rules around each submit and poll request of one worker process."""

    def __init__(
        self,
        pacer: RequestPacer,
        throttle: ThrottleGate,
        breaker: BreakerGate,
        caps: RequestGate,
        *,
        attempt_log: AttemptSink,
        adaptive: AdaptiveMeter,
        flow_task_queue: str,
        events_task_queue: str,
    ) -> None:
        """`attempt_log` is where each request is logged; `adaptive` counts the submits of
        adaptive destinations; the destinations' flow workflows run on `flow_task_queue`, and
        send their operational events through the operations worker's `events_task_queue`."""
        self._pacer = pacer
        self._adaptive = adaptive
        # Reports to flows under way, kept until sent (a task nothing holds may be collected).
        self._reports: set[asyncio.Task[None]] = set()
        self._throttle = throttle
        self._breaker = breaker
        self._caps = caps
        self.attempt_log = attempt_log
        self._flow_task_queue = flow_task_queue
        self._events_task_queue = events_task_queue

    @classmethod
    def for_destinations(
        cls,
        destinations: Sequence[Destination],
        client: Client,
        *,
        ledger: Engine | None,
        default_request_s: float,
        flow_task_queue: str,
        events_task_queue: str,
    ) -> FlowGuard:
        """The guard of a process delivering to `destinations`, each under its flow policy.

        `ledger` is the database caps and quotas count in, the attempt log is written to and
        the rules changed at run time are read from (`readmodel.flow_overrides`); without one,
        none of those (and no destination may have caps or quotas). A request takes its
        provider's `timeout_s`, else `default_request_s`."""
        limits = flow_limits(destinations, default_request_s)
        if ledger is None:
            caps: RequestGate = NoCapsGate(limits)
            attempt_log: AttemptSink = NoAttemptLog()
            breaker = BreakerGate(breaker_queues(destinations))
        else:
            policies = FlowPolicies(ledger, {d.name: d.flow for d in destinations})
            caps = CapsGate(ledger, limits, policies)
            attempt_log = attempts.AttemptLog(ledger)
            breaker = BreakerGate(breaker_queues(destinations), policies=policies.current)
        return cls(
            RequestPacer(paced_queues(destinations), server_rate_reader(client)),
            ThrottleGate(throttled_queues(destinations)),
            breaker,
            caps,
            attempt_log=attempt_log,
            adaptive=AdaptiveMeter(adaptive_queues(destinations)),
            flow_task_queue=flow_task_queue,
            events_task_queue=events_task_queue,
        )

    @contextlib.asynccontextmanager
    async def submit(self, request: SubmitRequest) -> AsyncIterator[None]:
        """Around one submit request. A failure the activity reports as transient (the
        contract's `ItemErrorType.TRANSIENT`) counts for the throttle and breaker rules."""
        destination = request.destination
        await self._pace(submit_task_queue(destination))
        async with self._slot(destination, request.concurrency_key, submit=True):
            started = time.monotonic()
            try:
                with attempts.capture("submit") as made:
                    try:
                        yield
                    finally:
                        if made:
                            self.attempt_log.add(request.item_id, made)
            except ApplicationError as err:
                # Only a transient failure says anything of the provider's load: a permanent
                # one (a refused body, with or without a status) is the request's own fault.
                if err.type == ItemErrorType.TRANSIENT:
                    first = err.details[0] if err.details else None
                    details = (
                        first
                        if isinstance(first, DeliveryErrorDetails)
                        else DeliveryErrorDetails.from_details(err.details)
                    )
                    self._outcome(destination, started, failed=True, status=details.status_code)
                    await self._throttled(destination, details)
                    await self._failed(destination, details, err.message)
                raise
        self._outcome(destination, started, failed=False, status=None)
        self._breaker.succeeded(destination)

    def _outcome(
        self, destination: str, started: float, *, failed: bool, status: int | None
    ) -> None:
        """Count a submit for an adaptive destination's rate; at each interval's end, tell its
        flow in the background (`flowcontrol.adaptive`): the submit does not wait for it."""
        report = self._adaptive.observe(
            destination, time.monotonic() - started, failed=failed, status=status
        )
        if report is None:
            return
        task = asyncio.get_running_loop().create_task(self._report(activity.client(), report))
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    async def _report(self, client: Client, report: SubmitOutcomes) -> None:
        try:
            await self._tell_flow(report.destination, SUBMIT_OUTCOMES_SIGNAL, report, client)
        except Exception as exc:
            # Best effort: the next interval's report counts afresh.
            activity.logger.warning("outcomes of %s not reported: %s", report.destination, exc)

    @contextlib.asynccontextmanager
    async def poll(self, request: PollRequest, *, paced: bool = True) -> AsyncIterator[None]:
        """Around one poll request; one that is not `paced` rides on its submit's turn (the
        submit activity's own first poll)."""
        if paced:
            await self._pace(poll_task_queue(request.destination))
        async with self._slot(request.destination, request.concurrency_key, submit=False):
            with attempts.capture("poll") as made:
                try:
                    yield
                finally:
                    if made:
                        self.attempt_log.add(request.item_id, made)

    async def _pace(self, task_queue: str) -> None:
        """Hold this process's requests while it knows the queue is throttled, and space them
        at the queue's rate (`flowcontrol.pacing`)."""
        await self._throttle.hold(task_queue)
        # The activity's priority (its item's, or its batch's most urgent): what this process
        # was dispatched goes most urgent first too
        # (`durable_outbox_temporal/contract/priority.py`).
        await self._pacer.acquire(task_queue, activity.info().priority.priority_key)

    @contextlib.asynccontextmanager
    async def _slot(
        self, destination: str, key: str | None, *, submit: bool
    ) -> AsyncIterator[None]:
        """The request's permits and quota (`flowcontrol/caps.py`) while it runs: waited for
        while the activity has time to spare, else the item is told it is held."""
        if not self._caps.applies(destination):
            yield
            return
        info = activity.info()
        timeout = info.start_to_close_timeout or timedelta(0)
        deadline = (info.started_time + timeout - self._caps.request_time(destination)).timestamp()
        try:
            async with self._caps.slot(
                destination, key, submit=submit, deadline=deadline, heartbeat=activity.heartbeat
            ):
                yield
        except Held as err:
            raise ApplicationError(
                str(err),
                DeliveryErrorDetails(retry_after_s=err.retry_after_s),
                type=ItemErrorType.HELD,
                non_retryable=True,
                category=ApplicationErrorCategory.BENIGN,
            ) from None

    async def _throttled(self, destination: str, err: DeliveryErrorDetails) -> None:
        """A throttle pauses the whole destination's submit queue until its Retry-After, and
        the destination's flow workflow resumes it (`flowcontrol.throttle`). Best effort: if
        the server cannot be told, the item still waits its own Retry-After."""
        found = self._throttle.throttled(destination, err.status_code, err.retry_after_s)
        if found is None:
            return
        queue, until = found
        cause = f"HTTP {err.status_code} from {destination}"
        seen = Throttled(
            destination=destination,
            task_queue=queue.task_queue,
            until=until,
            seen_at=datetime.now(UTC),
            status=err.status_code or 0,
            configured_rate=queue.configured_rate,
        )
        client = activity.client()
        try:
            paused = await throttle_queue(
                client,
                queue.task_queue,
                until,
                cause,
                identity=f"durable-outbox-worker ({activity.info().workflow_id})",
            )
            if not paused:
                # Paused by hand, by a 410 or by a longer throttle: nothing for the flow to
                # resume at this one's end.
                return
            self._throttle.paused(queue.task_queue, until)
            await self._tell_flow(destination, THROTTLED_SIGNAL, seen)
        except Exception as exc:
            # A server without task-queue config (the time-skipping test server), or one that
            # did not answer: the item still waits its own Retry-After.
            self._throttle.not_paused(queue.task_queue)
            activity.logger.warning("throttle of %s not shared: %s", destination, exc)

    async def _failed(self, destination: str, err: DeliveryErrorDetails, message: str) -> None:
        """Count a failed submit against the destination's circuit; when this process's
        failures cross its threshold, tell the destination's flow workflow, which opens it
        (`flowcontrol.breaker`). Best effort, as a throttle's report."""
        if not is_failure(err.status_code, err.retry_after_s):
            return
        seen = self._breaker.failed(destination, message)
        if seen is None:
            return
        try:
            # A server without task-queue config (the time-skipping test server) could not
            # pause the queue: asked first, so no flow starts there for nothing.
            await read_queue_rate(activity.client(), seen.task_queue)
            await self._tell_flow(destination, FAILING_SIGNAL, seen)
        except RPCError as exc:
            if exc.status == RPCStatusCode.UNIMPLEMENTED:
                self._breaker.unsupported(destination)
            else:
                self._breaker.not_reported(destination)
            activity.logger.warning("failing %s not reported: %s", destination, exc)
        except Exception as exc:
            self._breaker.not_reported(destination)
            activity.logger.warning("failing %s not reported: %s", destination, exc)

    async def _tell_flow(
        self,
        destination: str,
        signal: str,
        seen: Throttled | Failing | SubmitOutcomes,
        client: Client | None = None,
    ) -> None:
        """Signal the destination's flow workflow, starting it if it is not running."""
        queue = self._throttle.queue(destination)
        policy = FlowPolicy()
        await (client or activity.client()).start_workflow(
            FLOW_WORKFLOW_TYPE,
            FlowState(
                destination=destination,
                task_queue=seen.task_queue,
                configured_rate=seen.configured_rate,
                ramp_step_s=queue.ramp_step_s if queue else policy.throttle_ramp_step_s,
                storm_window_s=queue.storm_window_s if queue else policy.throttle_storm_window_s,
                events_destination=queue.events_destination if queue else None,
                events_task_queue=self._events_task_queue,
            ),
            id=flow_workflow_id(destination),
            task_queue=self._flow_task_queue,
            start_signal=signal,
            start_signal_args=[seen],
            static_summary=f"Flow control of {destination}",
        )
