"""Submit and poll activities: the only code that talks to external providers.

Each destination's activities run on that destination's own task queues, whose rates the
Temporal server enforces; each request goes through the worker's one flow guard
(`flowcontrol.guard`), and the class itself translates provider outcomes into the typed errors
the item workflow understands. One outcome acts on the destination: an endpoint answering 410
Gone pauses it (both queues, as `PATCH /v1/destinations/{name}` would), so nothing more is sent
there until an operator resumes it.

Submits and polls heartbeat while they run, when their workflow gave them a heartbeat timeout
(`_to_the_end`): a task the server recorded as started that reached no worker is then tried
again after that timeout rather than after its start-to-close timeout. Once a request may have
gone, the activity runs to its end whatever cancel a heartbeat brings back, so a cancel never
leaves a request's fate unknown. A batch of submits heartbeats its outcomes so far, and its next
attempt sends only what those did not record (`BatchProgress`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Coroutine, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from durable_outbox_temporal.contract.flow import PROBE_ACTIVITY, ProbeResult
from durable_outbox_temporal.contract.ids import poll_task_queue, submit_task_queue
from durable_outbox_temporal.contract.item import (
    POLL_ACTIVITY,
    POLL_BATCH_ACTIVITY,
    SUBMIT_ACTIVITY,
    SUBMIT_BATCH_ACTIVITY,
    BatchProgress,
    DeliveryErrorDetails,
    ItemErrorType,
    PollOutcome,
    PollRequest,
    PollResult,
    SubmitOutcome,
    SubmitRequest,
    SubmitResult,
)
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from activities.delivery_projection import TransitionProjection
from activities.providers.base import (
    EndpointGoneError,
    PermanentProviderError,
    Provider,
    TransientProviderError,
)
from flowcontrol.breaker import is_failure
from flowcontrol.guard import FlowGuard
from flowcontrol.queue_rates import pause_queues_not_paused

Result = TypeVar("Result", SubmitResult, PollResult)
Returned = TypeVar("Returned")

# The heartbeat timeout the workflows give submits and polls (`_to_the_end`): a task started
# that reached no worker is tried again this long after its start, not a start-to-close timeout
# later.
HEARTBEAT_TIMEOUT = timedelta(seconds=10)
# A running delivery activity heartbeats this many times per heartbeat timeout, the first after
# one such interval (so a request that ends sooner, nearly all, sends none), and the worker sends
# them as they come (`HEARTBEAT_THROTTLE`, `worker.delivery_workers`; the SDK's default holds
# them to 0.8 of the timeout), so the server hears from a running activity well within it even
# when a heartbeat's answer is slow.
BEATS_PER_TIMEOUT = 3
HEARTBEAT_THROTTLE = HEARTBEAT_TIMEOUT / BEATS_PER_TIMEOUT


class DeliveryActivities:
    """Submit/poll activities over a fixed set of providers, one per destination name, each
    request through `guard` (pacing, throttle, breaker, caps and quotas, the attempt log).

    A request that carries its item's `projection` context gets its transition projected by
    `projection` (`activities.delivery_projection`): here, in the step that already did I/O, by
    a worker that has the read model, the result's `projected_at` telling the workflow so and
    the time to apply it at; else, or when the write fails, by the workflow itself."""

    def __init__(
        self,
        providers: Mapping[str, Provider],
        guard: FlowGuard,
        projection: TransitionProjection,
    ) -> None:
        self._providers = dict(providers)
        self._guard = guard
        self._projection = projection

    @activity.defn(name=SUBMIT_ACTIVITY)
    async def submit_item(self, request: SubmitRequest) -> SubmitResult:
        """Hand the item to its provider; raises typed errors the workflow retries or fails on."""
        return await _to_the_end(self._submit(request))

    async def _submit(self, request: SubmitRequest) -> SubmitResult:
        began = time.monotonic()
        _say_if_late(activity.info().started_time)
        provider = self._provider(request.destination)
        async with self._guard.submit(request), _typed_errors(request.destination):
            _say_if_held(began, request.item_id)
            _request_goes()
            result = await provider.submit(request)
        if request.projection is not None:
            await self._projection.submitted(
                request.item_id, request.projection, request.payload, result, began
            )
        if request.first_poll_after_s is not None and _poll_follows(result, request):
            result.first_poll = await self._first_poll(request, result, began)
        return result

    @activity.defn(name=POLL_ACTIVITY)
    async def poll_operation(self, request: PollRequest) -> PollResult:
        """Observe the provider's long-running operation once."""
        return await _to_the_end(self._poll(request, time.monotonic(), paced=True))

    @activity.defn(name=PROBE_ACTIVITY)
    async def probe_destination(self, destination: str) -> ProbeResult:
        """One probe of a destination whose circuit is open (`flowcontrol.breaker`): a request
        that delivers nothing; ok unless it failed as a failing submit would have."""
        provider = self._provider(destination)
        try:
            detail = await provider.probe()
        except TransientProviderError as err:
            if is_failure(err.status_code, err.retry_after_s):
                return ProbeResult(ok=False, detail=str(err))
            detail = f"answered {err.status_code}: {err}"
        except (PermanentProviderError, EndpointGoneError) as err:
            # Reachable and answering: whatever the request's fault, the destination is up.
            detail = f"answered: {err}"
        return ProbeResult(ok=True, detail=detail)

    async def _poll(self, request: PollRequest, began: float, *, paced: bool) -> PollResult:
        """One poll, projected; `began` is when its activity started here."""
        provider = self._provider(request.destination)
        async with self._guard.poll(request, paced=paced), _typed_errors(request.destination):
            _request_goes()
            result = await provider.poll(request)
        if request.projection is not None:
            await self._projection.polled(request.item_id, request.projection, result, began)
        return result

    async def _first_poll(
        self, request: SubmitRequest, accepted: SubmitResult, began: float
    ) -> PollResult | None:
        """The accepted operation's first poll, made here once it falls due (`poll_in_submit`).
        None when it could not be made: the workflow then polls as usual, at the time the
        submit set. It is not paced on the poll queue: it rides on the submit's request, whose
        rate the poll queue's leaves room for."""
        # When the workflow's own timer would have fired (`transitions.apply_submit_result`).
        planned = request.first_poll_after_s or 0.0
        delay = planned if accepted.retry_after_s is None else accepted.retry_after_s
        await asyncio.sleep(max(0.0, delay - (time.monotonic() - began)))
        poll = PollRequest(
            destination=request.destination,
            item_id=request.item_id,
            operation_url=accepted.operation_url or "",
            projection=request.projection,
        )
        if poll.projection is not None:
            # What the submit projected is written: the poll's projection carries its own.
            poll.projection.state.events.clear()
            poll.projection.state.poll_count += 1
        try:
            return await self._poll(poll, began, paced=False)
        except Exception as err:
            activity.logger.info(
                "first poll of %s left to a poll activity: %s", request.item_id, err
            )
            return None

    @activity.defn(name=SUBMIT_BATCH_ACTIVITY)
    async def submit_items(self, requests: list[SubmitRequest]) -> list[SubmitOutcome]:
        """Several items' submits at once (a bulk shard's `submit_batch`): each outcome is what
        `submit_item` would have returned or failed with for that item alone.

        The items of one `sequence` (a lane's run of items) go one after another, each once the
        one before went through (was delivered, or accepted where `accepted_goes_on`): the
        provider sees them exactly as it would one item at a time. After one that did not, the
        rest are `not_attempted`."""
        return await _to_the_end(self._submit_all(requests))

    async def _submit_all(self, requests: list[SubmitRequest]) -> list[SubmitOutcome]:
        outcomes: list[SubmitOutcome] = [SubmitOutcome(not_attempted=True)] * len(requests)
        recorded = recorded_by_the_last_attempt(len(requests))
        sending = _SENDING.get()
        progress = BatchProgress({str(index): outcome for index, outcome in recorded.items()})
        if sending is not None:
            sending.progress = progress
        sequences: dict[str, list[int]] = {}
        for index, request in enumerate(requests):
            if request.sequence is not None:
                sequences.setdefault(request.sequence, []).append(index)

        async def alone(index: int) -> None:
            if index in recorded:
                outcomes[index] = recorded[index]
                return
            result, failure = await _outcome(self._submit(requests[index]))
            outcomes[index] = progress.outcomes[str(index)] = SubmitOutcome(result, *failure)

        async def in_sequence(indexes: list[int]) -> None:
            for index in indexes:
                await alone(index)
                if not went_through(requests[index], outcomes[index]):
                    return

        await asyncio.gather(
            *(alone(i) for i, request in enumerate(requests) if request.sequence is None),
            *(in_sequence(indexes) for indexes in sequences.values()),
        )
        return outcomes

    @activity.defn(name=POLL_BATCH_ACTIVITY)
    async def poll_operations(self, requests: list[PollRequest]) -> list[PollOutcome]:
        """Several items' polls at once (a bulk shard's `poll_batch`): each outcome is what
        `poll_operation` would have returned or failed with for that item alone."""
        return await _to_the_end(self._poll_all(requests))

    async def _poll_all(self, requests: list[PollRequest]) -> list[PollOutcome]:
        began = time.monotonic()
        outcomes = await asyncio.gather(
            *(_outcome(self._poll(request, began, paced=True)) for request in requests)
        )
        return [PollOutcome(result, *failure) for result, failure in outcomes]

    def _provider(self, destination: str) -> Provider:
        provider = self._providers.get(destination)
        if provider is None:
            # A worker started without this destination's config: a deployment error that
            # retrying on this worker cannot fix.
            raise ApplicationError(
                f"this worker has no provider for destination {destination!r}",
                type=ItemErrorType.PERMANENT,
                non_retryable=True,
            )
        return provider


@dataclass
class _Sending:
    """Whether one of the activity's provider requests may have gone, and, for a batch of
    submits, the outcomes it has so far (its heartbeats carry them: `BatchProgress`)."""

    requested: bool = False
    progress: BatchProgress | None = None

    def details(self) -> tuple[Any, ...]:
        if self.progress is None or not self.progress.outcomes:
            return ()
        # A copy: the SDK converts details after the call, while more outcomes come in.
        return (BatchProgress(dict(self.progress.outcomes)),)


def recorded_by_the_last_attempt(count: int) -> dict[int, SubmitOutcome]:
    """A batch's attempt's start: the outcomes the last attempt's heartbeats recorded (none on a
    first attempt)."""
    info = activity.info()
    if info.attempt <= 1:
        return {}
    return BatchProgress.read(info.heartbeat_details, count, activity.payload_converter())


_SENDING: ContextVar[_Sending | None] = ContextVar("delivery_sending", default=None)


def _request_goes() -> None:
    """A provider request leaves now: from here the activity runs to its end (`_to_the_end`)."""
    sending = _SENDING.get()
    if sending is not None:
        sending.requested = True


async def _to_the_end(body: Coroutine[Any, Any, Returned]) -> Returned:
    """Run a delivery activity's body, heartbeating while it runs if its workflow gave it a
    heartbeat timeout.

    Under load the server can record a task as started that no worker ever receives (its start
    committed after the matching service stopped waiting for the answer:
    temporalio/temporal#11733); full bench runs lost a few submits a round that way, each
    retried only when its start-to-close timeout (a minute) ran out. With heartbeats such a task
    is tried again after the heartbeat timeout.

    Heartbeats also bring the workflow's cancels to the activity, which without them never
    reached one running (`workflows.delivery.Delivery._withdraw_submit`). One that comes before
    any request went cancels the activity; after, it is not acted on, so the activity's outcome
    stands and no request's fate is left unknown. A worker shutting down cancels it, as before.
    Without a heartbeat timeout (a workflow from before) the body runs as it always did."""
    timeout = activity.info().heartbeat_timeout
    if not timeout:
        return await body
    # A retry's earlier attempt may have sent its requests (a worker killed after the provider
    # took them): a cancel must not pass that off as withdrawn, so it is never acted on.
    sending = _Sending(requested=activity.info().attempt > 1)
    token = _SENDING.set(sending)
    try:
        task = asyncio.ensure_future(body)  # a copy of this context: it sees `sending`
    finally:
        _SENDING.reset(token)
    heartbeats = _Heartbeats(timeout.total_seconds() / BEATS_PER_TIMEOUT, sending)
    try:
        while True:
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:
                if task.cancelled():
                    raise  # the body itself was cancelled
                if sending.requested and not activity.is_worker_shutdown():
                    # Finish (or, if the body has just ended, return its outcome): the
                    # request's outcome is what the workflow gets.
                    current = asyncio.current_task()
                    if current is not None:
                        current.uncancel()
                    continue
                if not task.done():
                    task.cancel()
                    await asyncio.wait([task])
                raise
    finally:
        heartbeats.stop()


class _Heartbeats:
    """`activity.heartbeat()` every `every_s` (the first after `every_s`) until stopped, with
    the batch's progress so far: a timer on the loop, no task of its own."""

    def __init__(self, every_s: float, sending: _Sending) -> None:
        self._every_s = every_s
        self._sending = sending
        self._loop = asyncio.get_running_loop()
        # The callback runs in a copy of this (the activity's) context, as `heartbeat` needs.
        self._next = self._loop.call_later(every_s, self._beat)

    def _beat(self) -> None:
        activity.heartbeat(*self._sending.details())
        self._next = self._loop.call_later(self._every_s, self._beat)

    def stop(self) -> None:
        self._next.cancel()


_Failure = tuple[str | None, str | None, DeliveryErrorDetails | None]


async def _outcome(call: Awaitable[Result]) -> tuple[Result | None, _Failure]:
    """One request of a batch: its result, or the (error type, message, details) its own
    activity would have failed with. The batch's other requests stand either way."""
    try:
        return await call, (None, None, None)
    except ApplicationError as err:
        first = err.details[0] if err.details else None
        details = (
            first
            if isinstance(first, DeliveryErrorDetails)
            else DeliveryErrorDetails.from_details(err.details)
        )
        return None, (err.type, err.message, details)
    except Exception as err:
        # What a single request's activity would have failed with, retried by Temporal: here
        # a transient failure of this item's request only.
        return None, (ItemErrorType.TRANSIENT, f"{type(err).__name__}: {err}", None)


def _poll_follows(accepted: SubmitResult, request: SubmitRequest) -> bool:
    """Whether the submit activity polls the accepted operation itself: an operation to poll,
    its projection (if any) written, and no Retry-After asking for longer than planned."""
    if accepted.delivered or not accepted.operation_url:
        return False
    if request.projection is not None and accepted.projected_at is None:
        return False
    planned = request.first_poll_after_s or 0.0
    return accepted.retry_after_s is None or accepted.retry_after_s <= planned


@contextlib.asynccontextmanager
async def _typed_errors(destination: str) -> AsyncIterator[None]:
    """Provider errors become the ApplicationError types the workflow retries, fails or waits
    on; a gone endpoint first pauses its destination."""
    try:
        yield
    except TransientProviderError as err:
        raise _transient(err) from err
    except PermanentProviderError as err:
        raise _permanent(err) from err
    except EndpointGoneError as err:
        raise await _pause_for_gone_endpoint(destination, err) from err


async def _pause_for_gone_endpoint(destination: str, err: EndpointGoneError) -> ApplicationError:
    """Pause the destination's queues (unless paused already: an operator's or an earlier 410's
    reason stays) and return the error that tells the workflow to wait for the resume."""
    reason = f"410 Gone from {err.endpoint} at {datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC"
    paused = await pause_queues_not_paused(
        activity.client(),
        [submit_task_queue(destination), poll_task_queue(destination)],
        reason,
        # Who paused it, in the queue's config: the item whose submit saw the 410.
        identity=f"durable-outbox-worker ({activity.info().workflow_id})",
    )
    outcome = f"paused: {reason}" if paused else "already paused"
    return ApplicationError(
        f"{err}; destination {destination} {outcome}",
        DeliveryErrorDetails(status_code=err.status_code),
        type=ItemErrorType.DESTINATION_GONE,
        non_retryable=True,
        category=ApplicationErrorCategory.BENIGN,
    )


def _transient(err: TransientProviderError) -> ApplicationError:
    return ApplicationError(
        str(err),
        DeliveryErrorDetails(
            retry_after_s=err.retry_after_s, status_code=err.status_code, error_code=err.error_code
        ),
        type=ItemErrorType.TRANSIENT,
        non_retryable=True,
        # Expected and handled by the workflow: logged without a traceback, not as an error.
        category=ApplicationErrorCategory.BENIGN,
    )


def _permanent(err: PermanentProviderError) -> ApplicationError:
    return ApplicationError(
        str(err),
        DeliveryErrorDetails(status_code=err.status_code, error_code=err.error_code),
        type=ItemErrorType.PERMANENT,
        non_retryable=True,
    )


def went_through(request: SubmitRequest, outcome: SubmitOutcome) -> bool:
    """Whether the next item of the request's sequence may go: this one was delivered, or was
    accepted where the lane goes on once accepted (`order = "submit"`)."""
    result = outcome.result
    return result is not None and (result.delivered or request.accepted_goes_on)


# A submit this much later than its dispatch, or held this long before its request, is told in
# the log: full bench runs saw a few items a round end a minute after the rest, their request
# sent a minute after the server had started their activity, the worker idle meanwhile
# (issue 43). Neither was ever logged: those were first attempts no worker received, tried again
# at their start-to-close timeout (now the heartbeat timeout: `_to_the_end`).
SLOW_START_S = 5.0


def _say_if_late(started_time: datetime) -> None:
    late_s = (datetime.now(UTC) - started_time).total_seconds()
    if late_s > SLOW_START_S:
        activity.logger.warning(
            "activity reached this worker %.1f s after the server started it", late_s
        )


def _say_if_held(began: float, item_id: str) -> None:
    held_s = time.monotonic() - began
    if held_s > SLOW_START_S:
        activity.logger.warning(
            "submit of %s held %.1f s before its request (pacing, a throttle's pause, caps)",
            item_id,
            held_s,
        )
