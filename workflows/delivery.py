"""The delivery state machine: one item, from `queued` to `sent`, `failed` or `cancelled`.

One implementation, hosted by the item workflow (one delivery per workflow) and meant to be
hosted by many-deliveries-per-workflow hosts alike. What differs between hosts is behind
`DeliveryHost`: where a transition's projection goes, how a wait is timed, what the Web UI shows,
and when the host continues as new; a host of many deliveries may also run their submits and
polls in activities shared between them (`SharedActivityHost`). Everything else (submit,
Retry-After, backoff, polling, deadlines, attempts, cancel, delivery reports, the events) is here,
once.

Retries of *classified* provider failures are driven here rather than by Temporal's activity
retry policy, so the status query can show attempts, the last error and the next attempt time,
and so `Retry-After` is honoured exactly. Temporal still retries what only infrastructure can
cause (a worker killed mid-activity, an unexpected exception) a few times.

Submits and polls carry the outbox as their fairness key: on a server with fairness on, the
destination's queues share their rate between outboxes, so one outbox's backlog does not hold
another's items behind it.

Transitions are computed by `durable_outbox_temporal.contract.transitions`, the same functions the
submit and poll activities apply when they project the transition they cause (`activities_project`):
the workflow then applies it at the activity's time and writes nothing itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from temporalio import workflow
from temporalio.common import Priority, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, RetryState
from temporalio.exceptions import TimeoutError as ActivityTimeoutError
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from durable_outbox_temporal.contract import transitions
    from durable_outbox_temporal.contract.ids import outbox_fairness_key, provider_idempotency_key
    from durable_outbox_temporal.contract.item import (
        CancelRequest,
        DeliveryErrorDetails,
        DeliveryPolicy,
        DeliveryReport,
        ItemErrorType,
        ItemEventType,
        ItemProjection,
        ItemStatus,
        OperationStatus,
        OutboxItemInput,
        OutboxItemState,
        OutboxItemView,
        PollOutcome,
        PollRequest,
        PollResult,
        ProjectionContext,
        SubmitOutcome,
        SubmitRequest,
        SubmitResult,
        apply_delivery_report,
        report_event_detail,
    )

    from activities.delivery import HEARTBEAT_TIMEOUT, DeliveryActivities
    from configuration.providers import RETRY_AFTER_LIMIT_S

# Our own classified errors come back to the workflow at once; anything else (a worker killed
# mid-request, a bug) Temporal retries a few times before the workflow counts it as an attempt.
_INFRASTRUCTURE_RETRIES = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_attempts=3,
    non_retryable_error_types=[ItemErrorType.TRANSIENT, ItemErrorType.PERMANENT],
)
# A shared submit or poll activity is retried like one item's; its items' own outcomes are
# inside it.
BATCH_RETRIES = _INFRASTRUCTURE_RETRIES
# A submit a cancel may withdraw gets one attempt from the server; should that fail unclassified,
# the workflow starts the rest as an activity no cancel withdraws (`retried_by_the_workflow`). A
# cancel reaching the server's own retry while it waits out its backoff is done at once and looks
# to the workflow exactly like a submit no worker ever took, though the attempt before may have
# reached the provider (docs/decisions/delivery-heartbeats.md).
WITHDRAWABLE_ATTEMPT = RetryPolicy(
    initial_interval=_INFRASTRUCTURE_RETRIES.initial_interval,
    maximum_attempts=1,
    non_retryable_error_types=_INFRASTRUCTURE_RETRIES.non_retryable_error_types,
)
AFTER_A_WITHDRAWABLE_ATTEMPT = RetryPolicy(
    initial_interval=_INFRASTRUCTURE_RETRIES.initial_interval,
    maximum_attempts=_INFRASTRUCTURE_RETRIES.maximum_attempts - 1,
    non_retryable_error_types=_INFRASTRUCTURE_RETRIES.non_retryable_error_types,
)
# The patch that has the workflow retry a withdrawable submit's failed attempt; asked only when
# one failed, so a delivery that never fails records no marker.
_SUBMIT_RETRIED_BY_THE_WORKFLOW = "submit-retried-by-the-workflow"
Request = TypeVar("Request", SubmitRequest, PollRequest)
Result = TypeVar("Result", SubmitResult, PollResult)
Outcome = TypeVar("Outcome", SubmitOutcome, PollOutcome)
# Reports for a message the item has not yet recorded as accepted (the provider can be faster
# than the submit activity's answer), kept until it has; bounded against a flood of strays.
_MAX_EARLY_REPORTS = 100
# A report that comes once the window has ended, while the delivery still waits for its
# workflow's handlers to finish before it is let go, is applied as one within it: dropped, and
# the delivery then let go, nothing would record it (docs/decisions/late-delivery-reports.md).
_REPORTS_WHILE_CLOSING = "reports-while-closing"
# The patch that lets a cancel withdraw a submit no worker has taken.
_CANCEL_WAITING_SUBMIT = "cancel-waiting-submit"
# The same for a submit waiting in, or for, an activity shared with other items' submits.
_CANCEL_SHARED_SUBMIT = "cancel-shared-submit"


def retried_by_the_workflow(err: ActivityError) -> bool:
    """Whether a withdrawable submit's failure goes on in a new activity (`WITHDRAWABLE_ATTEMPT`):
    its one attempt failed unclassified (a worker killed mid-request, a bug). Runs from before
    the patch had the server retry it, and end as they did."""
    return (
        err.retry_state is RetryState.MAXIMUM_ATTEMPTS_REACHED
        and not isinstance(err.cause, CancelledError)
        and workflow.patched(_SUBMIT_RETRIED_BY_THE_WORKFLOW)
    )


def rows_may_lead(request: SubmitRequest | PollRequest) -> None:
    """Tell the request's next activity that an earlier one may have written rows past the
    item's state (it failed after its provider answered): it numbers its own after them."""
    if request.projection is not None:
        request.projection.state.rows_may_lead = True


class DeliveryHost(Protocol):
    """What a delivery needs from any workflow that hosts it."""

    async def project(self, projection: ItemProjection) -> None:
        """Write the projection to the read model (idempotent by item and event seq)."""

    def status_changed(self, status: ItemStatus) -> None:
        """The item moved to `status` (the item workflow keeps its search attribute)."""

    def show_details(self, lines: list[str]) -> None:
        """What the Web UI's current details should say about the item now."""

    async def wait(
        self, duration: timedelta, summary: str, until: Callable[[], bool] | None
    ) -> None:
        """Wait `duration`, or less once `until()` holds; a durable timer either way."""

    async def checkpoint(self, delivery: Delivery) -> None:
        """A resting point while polling: the item workflow may continue as new here."""

    def gate(self, priority: int | None = None) -> Awaitable[None] | None:
        """Before each submit attempt and each poll, with the state at rest: None when the
        submit or poll may go now (it then holds one of the host's slots until `release`), or
        something to await before asking again (a host bounds what it has out at once, and
        holds new work back while it continues as new)."""

    def release(self) -> None:
        """A submit or poll let through by `gate` has been answered."""


class SharedActivityHost(Protocol):
    """A host that runs its deliveries' submits and polls in activities shared between them
    (bulk shards and lanes); a delivery without one runs each in an activity of its own."""

    def submit_batched(self) -> bool:
        """Whether submits go through `submit` (shared activities) rather than one activity
        each."""

    async def submit(
        self, request: SubmitRequest, policy: DeliveryPolicy, priority: int | None = None
    ) -> SubmitOutcome:
        """The outcome of one submit, run in an activity shared with other items' submits."""

    def withdraw_submit(self, request: SubmitRequest, error: Exception) -> bool:
        """Take back a shared submit no worker has sent (answered with `error`); False when
        it cannot be (gone out, a lane run's, or submits are not shared)."""

    def withdraws_to_hand_over(self) -> bool:
        """Whether this run of the host takes back, when it hands over (continues as new), what
        its deliveries have out that no worker has taken (`Delivery.withdraw_to_hand_over`):
        their polls then wait for a cancel's outcome, as withdrawable submits do."""

    def poll_batched(self) -> bool:
        """Whether polls go through `poll` (shared activities) rather than one activity each."""

    async def poll(
        self, request: PollRequest, policy: DeliveryPolicy, priority: int | None = None
    ) -> PollOutcome:
        """The outcome of one poll, run in an activity shared with other items' polls."""


class NotAttempted(Exception):
    """Raised out of `Delivery.run` when the item's first submit, part of a lane's run, was not
    sent because an item before it was not delivered: nothing happened to this item, and its
    lane runs it again in its turn."""


class DeliveryFailed(Exception):
    """The item ended failed: raised out of `Delivery.run` once the failure is recorded."""

    def __init__(self, message: str, error_type: ItemErrorType, view: OutboxItemView) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.view = view


class _Failed(Exception):
    """Raised inside the state machine to end the item failed."""

    def __init__(
        self, message: str, error_type: ItemErrorType, error_code: str | None = None
    ) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.error_code = error_code


class Withdrawn(Exception):
    """A submit or poll was taken back before any worker sent it: a queued item's submit by a
    cancel, or either by its host handing over (`Delivery.withdraw_to_hand_over`)."""


class _SharedFailed(Exception):
    """A shared submit's or poll's failure for this item: as its own activity's would have
    been."""

    def __init__(self, outcome: SubmitOutcome | PollOutcome) -> None:
        super().__init__(outcome.message)
        raw_type = outcome.error_type or ItemErrorType.TRANSIENT
        known = raw_type in (
            ItemErrorType.TRANSIENT,
            ItemErrorType.PERMANENT,
            ItemErrorType.DESTINATION_GONE,
            ItemErrorType.HELD,
        )
        self.classified = (
            ItemErrorType(raw_type) if known else ItemErrorType.TRANSIENT,
            outcome.message or "request failed",
            outcome.details or DeliveryErrorDetails(),
        )


class Delivery:
    """Delivers one outbox item: submit, poll the operation on durable timers, retry, report."""

    def __init__(
        self,
        item_id: str,
        item: OutboxItemInput,
        host: DeliveryHost,
        *,
        sharing: SharedActivityHost | None = None,
    ) -> None:
        self.item_id = item_id
        self.item = item
        self.state = item.state or OutboxItemState()
        self._host = host
        # Where its submits and polls may share activities with other items' (None: never).
        self._sharing = sharing
        self._early_reports: list[DeliveryReport] = []
        self._reports_closed = False
        # A submit or poll that will project its own transition is out: a report waits for it,
        # so the events the activity numbered are not numbered again here.
        self._projecting_activity_out = False
        # A submit or poll is scheduled and not yet answered (a host continues as new only
        # when none is).
        self.activity_out = False
        # A queued item's submit while it is scheduled, or a poll its host may withdraw: a
        # cancel withdraws the submit, the host's hand-over either (`_execute`).
        self._withdrawable_out: asyncio.Task[Any] | None = None
        # Its host is handing over: what it had out was taken back (`withdraw_to_hand_over`).
        self._handing_over = False
        # The same while it waits to go in an activity shared with others
        # (`SharedActivityHost.submit`).
        self._shared_submit: SubmitRequest | None = None
        # Set by a lane for the item's first submit: the run of items it goes in, in order.
        self.sequence: str | None = None
        self._resumed_in_backoff = (
            self.state.started
            and self.state.status is ItemStatus.QUEUED
            and self.state.next_attempt_at is not None
        )

    async def run(self, *, listen: bool = True) -> OutboxItemView:
        """Deliver the item; its final view. Raises `DeliveryFailed` once a failure is recorded,
        and `CancelledError` (after recording it) when Temporal cancels the host.

        `listen=False` returns as soon as the item is sent, before its report window: an
        ordering lane goes on to its next item while the host keeps this one open for its
        delivery reports (`listen`)."""
        state, item = self.state, self.item
        if not state.started:
            state.started = True
            state.created_at = state.created_at or item.enqueued_at or workflow.now()
            if state.last_event_seq:
                self._record(ItemEventType.REDRIVEN, ItemStatus.QUEUED, "redriven after failure")
                await self._project()
            elif item.enqueue_projected:
                # The enqueuer wrote this event's row already; the first submit projects it
                # again with its own transition (a no-op for the read model if it is there).
                self._record(
                    ItemEventType.ENQUEUED,
                    ItemStatus.QUEUED,
                    transitions.describe_enqueue(item),
                    at=item.enqueued_at,
                )
            else:
                self._record(
                    ItemEventType.ENQUEUED, ItemStatus.QUEUED, transitions.describe_enqueue(item)
                )
                await self._project()
        try:
            if state.status is ItemStatus.QUEUED:
                await self._submit_until_accepted()
            if state.status is ItemStatus.SENDING:
                await self._poll_until_done()
            if state.status is ItemStatus.SENT and listen:
                await self._listen_for_reports()
        except _Failed as failure:
            state.last_error_code = failure.error_code
            await self._finish(ItemStatus.FAILED, ItemEventType.FAILED, str(failure))
            raise DeliveryFailed(str(failure), failure.error_type, self.view()) from None
        except asyncio.CancelledError:
            # Cancelled from Temporal itself (Web UI, CLI): record it, then let Temporal end the
            # host as cancelled. Any other cancel is the worker evicting the run from its cache:
            # nothing may be recorded then, and a task that waited to record it would never end
            # (the worker retries such an eviction for ever, holding its slot).
            if workflow.cancellation_reason() is not None and not state.status.is_final:
                await self._finish(
                    ItemStatus.CANCELLED, ItemEventType.CANCELLED, "workflow cancelled"
                )
            raise
        return self.view()

    async def listen(self) -> None:
        """Stay open for the sent item's delivery reports (after `run(listen=False)`)."""
        await self._listen_for_reports()

    def view(self) -> OutboxItemView:
        """The item as the API, the query and the read model show it."""
        return OutboxItemView.of(self.item_id, self.item, self.state)

    # -- what handlers call ------------------------------------------------------------------

    def validate_cancel(self) -> None:
        if self.state.status is not ItemStatus.QUEUED:
            raise ApplicationError(
                f"item is {self.state.status.value}; only queued items can be cancelled",
                type=ItemErrorType.CANNOT_CANCEL,
            )

    async def cancel(self, request: CancelRequest) -> OutboxItemView:
        """Cancel a queued item; returns the view once the cancel has taken effect or lost."""
        if not self.state.cancel_requested:
            self.state.cancel_requested = True
            self.state.cancel_reason = request.reason
            self._withdraw_submit()
        # Returns once the submit loop has acted on it: `cancelled`, or `sending`/`sent` if a
        # submit already in flight won the race (the caller reports that as too late).
        await workflow.wait_condition(lambda: self.state.status is not ItemStatus.QUEUED)
        return self.view()

    def request_cancel(self, request: CancelRequest) -> None:
        """Cancel the item if it is still queued when the workflow sees this; else nothing."""
        if self.state.status is ItemStatus.QUEUED and not self.state.cancel_requested:
            self.state.cancel_requested = True
            self.state.cancel_reason = request.reason
            self._withdraw_submit()

    def _withdraw_submit(self) -> None:
        """Ask the server to cancel the submit that is out, if any: one no worker has taken
        ends cancelled at once (`Withdrawn`); one a worker runs finishes once its request went
        (`activities.delivery._to_the_end`), so a cancel never leaves a submit's fate unknown.
        Histories from before this waited for the submit whatever came. (Only a queued item
        is cancelled, so what is out is a submit, never a poll.)"""
        out = self._withdrawable_out
        if out is not None and not out.done() and workflow.patched(_CANCEL_WAITING_SUBMIT):
            out.cancel()
        shared = self._shared_submit
        # Only a submit given to the host's shared activities is ever set aside.
        if (
            shared is not None
            and self._sharing is not None
            and workflow.patched(_CANCEL_SHARED_SUBMIT)
        ):
            self._sharing.withdraw_submit(shared, Withdrawn())

    def withdraw_to_hand_over(self) -> None:
        """Its host hands over (continues as new) and what it has out waits on the server (a
        paused queue): ask the server to cancel this delivery's own submit or poll. One no
        worker has taken ends at once (`Withdrawn`), and the item is carried as it was before
        it; one a worker runs finishes once its request went. The host takes back the shared
        ones itself (`workflows.host._Batcher.withdraw_all`)."""
        self._handing_over = True
        out = self._withdrawable_out
        if out is not None and not out.done():
            out.cancel()

    async def delivery_report(self, report: DeliveryReport) -> None:
        """Record the provider's report on one recipient; a repeat or an older report changes
        nothing. Applied while sending too: the report may beat the poll that sees success."""
        state = self.state
        if self.item.policy.report_window_s <= 0:
            return
        if self._reports_closed and not workflow.patched(_REPORTS_WHILE_CLOSING):
            # Runs from before dropped a report that came after the window's end and before
            # the delivery was let go (while a handler of its workflow ran on).
            return
        if self.item.activities_project and self._projecting_activity_out:
            await workflow.wait_condition(lambda: not self._projecting_activity_out)
        if state.provider_message_id is None and not state.status.is_final:
            if len(self._early_reports) < _MAX_EARLY_REPORTS:
                self._early_reports.append(report)
            return
        if report.message_id != state.provider_message_id:
            return  # another generation's message, or a stray
        changed = apply_delivery_report(state.recipients, report)
        if changed is None:
            return
        detail = report_event_detail(changed)
        self._record(ItemEventType.DELIVERY_REPORT, state.status, detail)
        self._show_details(f"Delivery report: {detail}.")
        await self._project()

    async def project_pending(self) -> None:
        """Write what is not yet in the read model (before the host continues as new)."""
        await self._project()

    # -- the state machine -------------------------------------------------------------------

    async def _submit_until_accepted(self) -> None:
        item, state, policy = self.item, self.state, self.item.policy
        while True:
            if state.cancel_requested:
                await self._finish(
                    ItemStatus.CANCELLED, ItemEventType.CANCELLED, state.cancel_reason
                )
                return
            if self._resumed_in_backoff:
                # Carried across a host's continue-as-new in the middle of a backoff: wait out
                # the rest of it (Retry-After included) before the next attempt.
                self._resumed_in_backoff = False
                if state.next_attempt_at is not None and state.next_attempt_at > workflow.now():
                    await self._host.wait(
                        state.next_attempt_at - workflow.now(),
                        "rest of the backoff",
                        lambda: state.cancel_requested,
                    )
                continue
            gate = self._host.gate(self.item.priority)
            if gate is not None:
                await gate
                continue
            state.attempts += 1
            state.next_attempt_at = None
            # Kept in the state so every retry tells the provider the same first-sent time
            # (`SubmitRequest.first_submitted_at`); a redrive's fresh state starts it again.
            state.first_submitted_at = state.first_submitted_at or workflow.now()
            self._show_details(f"Submitting, attempt {state.attempts}/{policy.max_attempts}.")
            request = SubmitRequest(
                destination=item.destination,
                item_id=self.item_id,
                idempotency_key=provider_idempotency_key(self.item_id, item.generation),
                payload=item.payload,
                attempt=state.attempts,
                projection=self._context(),
                first_poll_after_s=self._first_poll_after_s(),
                # Only a first attempt goes in its lane's run; a retry goes alone.
                sequence=self.sequence,
                accepted_goes_on=policy.order == "submit",
                concurrency_key=item.concurrency_key,
                first_submitted_at=state.first_submitted_at,
            )
            self.sequence = None
            seq_before = state.last_event_seq
            first_submitted_at = state.first_submitted_at
            result: SubmitResult
            try:
                sharing = self._submits_shared()
                if sharing is not None:
                    self._shared_submit = request
                    try:
                        result = await self._shared(
                            request, sharing.submit(request, policy, self.item.priority)
                        )
                    finally:
                        self._shared_submit = None
                else:
                    result = await self._execute(
                        DeliveryActivities.submit_item,
                        request,
                        policy.submit_task_queue,
                        policy.submit_timeout_s
                        + (
                            0.0
                            if request.first_poll_after_s is None
                            else request.first_poll_after_s + policy.poll_timeout_s
                        ),
                        f"submit to {item.destination}, attempt {state.attempts}",
                        withdrawable=True,
                    )
            except Withdrawn:
                # Taken back before any worker sent the submit (its queue paused, say): it never
                # went, so it spent no attempt and set no first-sent time; the loop's head ends
                # the item cancelled, or its host's gate holds it for the next run.
                state.attempts -= 1
                state.first_submitted_at = first_submitted_at
                continue
            except (ActivityError, _SharedFailed) as err:
                error_type, message, details = _failure(err)
                if error_type is ItemErrorType.DESTINATION_GONE:
                    await self._wait_for_resume(message)
                    continue
                if error_type is ItemErrorType.HELD:
                    await self._wait_held(message, details.retry_after_s)
                    continue
                if error_type is not ItemErrorType.TRANSIENT:
                    raise _Failed(message, ItemErrorType.PERMANENT, details.error_code) from None
                if state.attempts >= policy.max_attempts:
                    raise _Failed(
                        f"gave up after {state.attempts} attempts: {message}",
                        ItemErrorType.DELIVERY_FAILED,
                        details.error_code,
                    ) from None
                await self._wait_before_retry(message, details.retry_after_s)
                continue
            at = result.projected_at or workflow.now()
            status_changed = transitions.apply_submit_result(item, state, result, at)
            self._follow_activity_numbering(result.projected_seq, seq_before)
            early_applied = self._apply_early_reports()
            self._after_transition(status_changed, result.projected_at, seq_before, early_applied)
            if result.delivered:
                self._show_details("Sent: delivered.")
            await self._project()
            if result.first_poll is not None:
                state.poll_count += 1
                self._take_poll(result.first_poll, state.last_event_seq)
                if not await self._end_if_done(result.first_poll):
                    await self._project()
            return

    def _first_poll_after_s(self) -> float | None:
        """When the submit activity polls the operation itself (`poll_in_submit`): one
        activity per item rather than two."""
        policy = self.item.policy
        if not policy.poll_in_submit or self._submits_shared() is not None:
            return None
        return policy.poll_interval_s

    def _submits_shared(self) -> SharedActivityHost | None:
        """The host whose shared activities take this item's submits; None: its own."""
        sharing = self._sharing
        return sharing if sharing is not None and sharing.submit_batched() else None

    def _polls_shared(self) -> SharedActivityHost | None:
        """The host whose shared activities take this item's polls; None: its own."""
        sharing = self._sharing
        return sharing if sharing is not None and sharing.poll_batched() else None

    async def _execute(
        self,
        activity: Callable[[DeliveryActivities, Request], Awaitable[Result]],
        request: Request,
        task_queue: str,
        timeout_s: float,
        summary: str,
        *,
        withdrawable: bool = False,
    ) -> Result:
        """Run a submit or poll on the destination's queue (its rate), with the outbox as its
        fairness key; while one that projects its own transition is out, reports wait.

        A `withdrawable` one is taken back by a cancel (a queued item's submit:
        `_withdraw_submit`) or by its host's hand-over (`withdraw_to_hand_over`), and waits for
        the cancel's outcome; it is awaited directly all the same, so deliveries sharing a host
        schedule their activities in the order they always did. A submit's attempts after a
        failed one are the workflow's, never withdrawn (`WITHDRAWABLE_ATTEMPT`); a poll, which
        sends nothing, keeps the server's retries."""
        submit = isinstance(request, SubmitRequest)
        self._projecting_activity_out = request.projection is not None
        self.activity_out = True
        try:

            def start(retries: RetryPolicy, summary: str) -> workflow.ActivityHandle[Result]:
                return workflow.start_activity_method(
                    activity,
                    request,
                    task_queue=task_queue,
                    start_to_close_timeout=timedelta(seconds=timeout_s),
                    # A start that reached no worker is tried again after this, not after the
                    # start-to-close timeout (`activities.delivery._to_the_end`).
                    heartbeat_timeout=HEARTBEAT_TIMEOUT,
                    retry_policy=retries,
                    summary=summary,
                    priority=self._priority(),
                    cancellation_type=(
                        ActivityCancellationType.WAIT_CANCELLATION_COMPLETED
                        if withdrawable
                        else ActivityCancellationType.TRY_CANCEL
                    ),
                )

            if not withdrawable:
                return await start(_INFRASTRUCTURE_RETRIES, summary)
            handle = self._withdrawable_out = start(
                WITHDRAWABLE_ATTEMPT if submit else _INFRASTRUCTURE_RETRIES, summary
            )
            try:
                return await handle
            except ActivityError as err:
                if isinstance(err.cause, CancelledError) and (
                    self.state.cancel_requested or self._handing_over
                ):
                    raise Withdrawn from None
                if not (submit and retried_by_the_workflow(err)):
                    raise
            finally:
                self._withdrawable_out = None
            # Its attempt may have reached the provider: the rest is never withdrawn, and it may
            # have written its outcome's rows, which the new activity's first attempt numbers
            # its own after (`OutboxItemState.rows_may_lead`).
            rows_may_lead(request)
            return await start(AFTER_A_WITHDRAWABLE_ATTEMPT, f"{summary}, tried again")
        finally:
            self._projecting_activity_out = False
            self.activity_out = False
            self._host.release()

    async def _shared(self, request: SubmitRequest | PollRequest, call: Awaitable[Outcome]) -> Any:
        """A submit or poll in an activity the host shares between items; its slot and its
        reports' wait as `_execute`'s. The outcome's result, or `_SharedFailed`."""
        self._projecting_activity_out = request.projection is not None
        self.activity_out = True
        try:
            outcome = await call
        finally:
            self._projecting_activity_out = False
            self.activity_out = False
            self._host.release()
        if isinstance(outcome, SubmitOutcome) and outcome.not_attempted:
            raise NotAttempted(self.item_id)
        if outcome.result is not None:
            return outcome.result
        raise _SharedFailed(outcome)

    def _context(self) -> ProjectionContext | None:
        """The state an activity projects its transition from, if this item lets it."""
        if not self.item.activities_project:
            return None
        return transitions.for_activity(self.item, self.state)

    def _follow_activity_numbering(self, projected_seq: int | None, seq_before: int) -> None:
        """Number the transition's events as the activity did: after the events an earlier,
        killed attempt of it wrote (`SubmitResult.projected_seq`), which stay in the read model
        as what the provider answered then."""
        if projected_seq is None:
            return
        offset = projected_seq - self.state.last_event_seq
        if offset <= 0:
            return
        for event in self.state.events:
            if event.seq > seq_before:
                event.seq += offset
        self.state.last_event_seq += offset

    def _after_transition(
        self,
        status_changed: bool,
        projected_at: datetime | None,
        seq_before: int,
        early_applied: bool,
    ) -> None:
        """After an activity's transition: keep the search attribute, and drop the events the
        activity projected (all of them, when nothing else happened meanwhile)."""
        if status_changed:
            self._host.status_changed(self.state.status)
        # The activity numbered one event past what it was sent (or past an earlier attempt's);
        # a report applied since (early reports change the recipients it wrote) makes the
        # workflow project again itself.
        pending = [event for event in self.state.events if event.seq > seq_before]
        if projected_at is not None and len(pending) == 1 and not early_applied:
            self.state.events.clear()

    def _priority(self) -> Priority:
        """The item's priority (`durable_outbox_temporal/contract/priority.py`), and fairness
        between outboxes
        within it (see the module docstring), on the destination's queues."""
        return Priority(
            priority_key=self.item.priority, fairness_key=outbox_fairness_key(self.item.outbox)
        )

    async def _wait_for_resume(self, message: str) -> None:
        """The endpoint answered 410 Gone and the submit paused the destination: record it and
        take the attempt back. The next submit then waits in the paused queue until an operator
        resumes the destination; the short timer first keeps a pause that somehow does not hold
        from turning this into a busy loop, and lets a cancel in."""
        state, policy = self.state, self.item.policy
        state.last_error = message
        state.next_attempt_at = None
        self._record(ItemEventType.DESTINATION_GONE, ItemStatus.QUEUED, message)
        state.attempts -= 1
        await self._project()
        self._show_details(f"{message}. Waiting for the destination to be resumed.")
        await self._host.wait(
            timedelta(seconds=policy.backoff_initial_s),
            "destination paused: 410 Gone",
            lambda: state.cancel_requested,
        )

    async def _wait_held(self, message: str, retry_after_s: float | None) -> None:
        """Its key's or its destination's cap or quota was full (`flowcontrol/caps.py`): take
        the attempt back and ask again when the gate said there would be room."""
        state = self.state
        state.attempts -= 1
        delay = timedelta(seconds=retry_after_s or self.item.policy.backoff_initial_s)
        state.next_attempt_at = workflow.now() + delay
        self._show_details(f"Submit {message}; asking again in {delay.total_seconds():.1f}s.")
        await self._host.wait(delay, "held by a cap or quota", lambda: state.cancel_requested)

    def _apply_early_reports(self) -> bool:
        """Apply the reports that arrived before the accept did; whether any changed a
        recipient."""
        state = self.state
        early, self._early_reports = self._early_reports, []
        changed = False
        for report in early:
            if report.message_id == state.provider_message_id:
                changed = apply_delivery_report(state.recipients, report) is not None or changed
        return changed

    async def _listen_for_reports(self) -> None:
        """Stay open for delivery reports until every recipient has settled or the window ends.

        A durable timer: the window outlives worker restarts and deploys like any other wait.
        """
        state, window_s = self.state, self.item.policy.report_window_s
        if window_s > 0 and state.recipients and state.finished_at is not None:
            until = state.finished_at + timedelta(seconds=window_s)
            remaining = until - workflow.now()
            if remaining > timedelta(0) and not self._all_recipients_settled():
                self._show_details(
                    f"Listening for delivery reports until {until:%Y-%m-%d %H:%M} UTC."
                )
                await self._host.wait(
                    remaining, "delivery report window", self._all_recipients_settled
                )
        self._reports_closed = True
        # A report being projected finishes before the item's final result is taken.
        await workflow.wait_condition(workflow.all_handlers_finished)

    def _all_recipients_settled(self) -> bool:
        return all(recipient.status.settled for recipient in self.state.recipients)

    async def _wait_before_retry(self, message: str, retry_after_s: float | None) -> None:
        state, policy = self.state, self.item.policy
        if retry_after_s is not None:
            # The provider said when; coming back earlier only earns another 429.
            delay = retry_after_s
            why = f"Retry-After {retry_after_s:g}s"
        else:
            delay = policy.backoff_s(state.attempts) * (
                1 + policy.backoff_jitter * workflow.random().random()
            )
            why = f"backoff {delay:.1f}s"
        state.last_error = message
        state.next_attempt_at = workflow.now() + timedelta(seconds=delay)
        self._record(ItemEventType.SUBMIT_FAILED, ItemStatus.QUEUED, f"{message} ({why})")
        await self._project()
        self._show_details(f"Attempt {state.attempts} failed: {message}. Retrying after {why}.")
        await self._host.wait(
            timedelta(seconds=delay), f"retry after {why}", lambda: state.cancel_requested
        )

    async def _poll_until_done(self) -> None:
        state, policy = self.state, self.item.policy
        assert state.operation_url is not None and state.operation_started_at is not None
        deadline = state.operation_started_at + timedelta(seconds=policy.poll_deadline_s)
        while True:
            now = workflow.now()
            if now >= deadline:
                raise _Failed(
                    f"operation timed out: still running after {policy.poll_deadline_s:g}s",
                    ItemErrorType.DELIVERY_FAILED,
                )
            wake_at = min(state.next_attempt_at or now, deadline)
            self._show_details(f"Operation accepted; next poll at {wake_at:%H:%M:%S} UTC.")
            if wake_at > now:
                await self._host.wait(wake_at - now, f"next poll #{state.poll_count + 1}", None)
            if workflow.now() >= deadline:
                continue
            result = await self._poll_once()
            if result is not None and await self._end_if_done(result):
                return
            await self._host.checkpoint(self)

    async def _end_if_done(self, result: PollResult) -> bool:
        """After a poll's result is taken: whether it ended the item sent; raises `_Failed`
        for an operation that failed or was cancelled."""
        if result.status is OperationStatus.SUCCEEDED:
            self._show_details("Sent: operation succeeded.")
            await self._project()
            return True
        if result.status in (OperationStatus.FAILED, OperationStatus.CANCELED):
            raise _Failed(
                result.error or f"operation {result.status.value}",
                ItemErrorType.DELIVERY_FAILED,
                result.error_code,
            )
        return False

    async def _poll_once(self) -> PollResult | None:
        """One poll; a transient poll failure is logged and the next poll is scheduled."""
        item, state, policy = self.item, self.state, self.item.policy
        while (gate := self._host.gate(self.item.priority)) is not None:
            await gate
        state.poll_count += 1
        request = PollRequest(
            destination=item.destination,
            item_id=self.item_id,
            operation_url=state.operation_url or "",
            projection=self._context(),
            concurrency_key=item.concurrency_key,
        )
        seq_before = state.last_event_seq
        result: PollResult
        try:
            sharing = self._polls_shared()
            if sharing is not None:
                result = await self._shared(
                    request, sharing.poll(request, policy, self.item.priority)
                )
            else:
                result = await self._execute(
                    DeliveryActivities.poll_operation,
                    request,
                    policy.poll_task_queue,
                    policy.poll_timeout_s,
                    f"poll operation #{state.poll_count}",
                    withdrawable=self._sharing is not None
                    and self._sharing.withdraws_to_hand_over(),
                )
        except Withdrawn:
            # Taken back by the host's hand-over before any worker took it: not a poll; the
            # host's gate holds the item for the next run. The cancel may have come while the
            # server's retry waited out its backoff, after an attempt that wrote its rows.
            state.poll_count -= 1
            state.rows_may_lead = True
            return None
        except (ActivityError, _SharedFailed) as err:
            error_type, message, details = _failure(err)
            if error_type is ItemErrorType.HELD:
                # Its key's or its destination's cap was full: asked again soon, not a poll.
                state.poll_count -= 1
                transitions.schedule_next_poll(item, state, workflow.now(), details.retry_after_s)
                self._show_details(f"Poll {message}; asking again.")
                return None
            # A gone endpoint (the destination is paused now) is polled again, after the resume.
            if error_type is ItemErrorType.PERMANENT:
                raise _Failed(
                    f"poll failed: {message}", ItemErrorType.PERMANENT, details.error_code
                ) from None
            state.last_error = f"poll failed: {message}"
            transitions.schedule_next_poll(item, state, workflow.now(), details.retry_after_s)
            self._record(ItemEventType.POLLED, ItemStatus.SENDING, state.last_error)
            await self._project()
            return None
        self._take_poll(result, seq_before)
        if not state.status.is_final:
            await self._project()
        return result

    def _take_poll(self, result: PollResult, seq_before: int) -> None:
        """Apply a poll's result (a failed or cancelled operation is left to `_end_if_done`)."""
        self.state.rows_may_lead = False
        at = result.projected_at or workflow.now()
        if transitions.apply_poll_result(self.item, self.state, result, at):
            self._follow_activity_numbering(result.projected_seq, seq_before)
            self._after_transition(
                self.state.status.is_final, result.projected_at, seq_before, early_applied=False
            )

    async def _finish(self, status: ItemStatus, event: ItemEventType, detail: str | None) -> None:
        if transitions.finish(self.state, status, event, workflow.now(), detail):
            self._host.status_changed(status)
        self._show_details(f"{status.value.capitalize()}: {detail}.")
        await self._project()

    def _record(
        self,
        event: ItemEventType,
        status: ItemStatus,
        detail: str | None,
        at: datetime | None = None,
    ) -> None:
        """Apply a transition at `at` (default: now): state and event history."""
        if transitions.record(self.state, event, status, at or workflow.now(), detail):
            self._host.status_changed(status)

    async def _project(self) -> None:
        """Write the transitions not yet in the read model."""
        state = self.state
        if not state.events:
            return
        projection = transitions.projection(self.item_id, self.item, state)
        await self._host.project(projection)
        # Projected events live on in the read model; dropping them keeps the state carried
        # across continue-as-new small however long an operation is polled. Only the ones sent:
        # a signal handler may have recorded more (and projected them) meanwhile.
        projected = {event.seq for event in projection.events}
        state.events[:] = [event for event in state.events if event.seq not in projected]

    def _show_details(self, line: str) -> None:
        state, policy = self.state, self.item.policy
        lines = [
            f"**{state.status.value}** — {self.item.destination}, outbox `{self.item.outbox}`",
            line,
            f"Attempts: {state.attempts}/{policy.max_attempts}; polls: {state.poll_count}.",
        ]
        if state.last_error:
            lines.append(f"Last error: {state.last_error}")
        if state.operation_url:
            lines.append(f"Operation: {state.operation_url}")
        if state.recipients:
            counts: dict[str, int] = {}
            for recipient in state.recipients:
                counts[recipient.status.value] = counts.get(recipient.status.value, 0) + 1
            summary = ", ".join(f"{count} {status}" for status, count in counts.items())
            lines.append(f"Recipients: {summary}.")
        self._host.show_details(lines)


def _failure(
    err: ActivityError | _SharedFailed,
) -> tuple[ItemErrorType, str, DeliveryErrorDetails]:
    """(error type, message, the provider's details) of a failed submit or poll, whether its
    own activity failed or its share of a batch did. A wait beyond any destination's
    `max_retry_after_s` fails the item: its date could overflow, and a shorter wait would break
    the provider's word."""
    error_type, message, details = (
        _classify(err) if isinstance(err, ActivityError) else err.classified
    )
    wait_s = details.retry_after_s
    if wait_s is not None and not wait_s <= RETRY_AFTER_LIMIT_S:
        message = (
            f"{message}: asked to retry after {wait_s:.0f} s, beyond the"
            f" {RETRY_AFTER_LIMIT_S:g} s any delivery waits"
        )
        details = DeliveryErrorDetails(
            status_code=details.status_code, error_code=details.error_code
        )
        return ItemErrorType.PERMANENT, message, details
    return error_type, message, details


def _classify(err: ActivityError) -> tuple[ItemErrorType, str, DeliveryErrorDetails]:
    """(error type, message, the provider's details) of a failed activity."""
    cause = err.cause
    if isinstance(cause, ApplicationError):
        details = DeliveryErrorDetails.from_details(cause.details)
        raw_type = cause.type or ItemErrorType.TRANSIENT
        if raw_type in (
            ItemErrorType.TRANSIENT,
            ItemErrorType.PERMANENT,
            ItemErrorType.DESTINATION_GONE,
            ItemErrorType.HELD,
        ):
            error_type = ItemErrorType(raw_type)
        else:
            # An unexpected exception survived the infrastructure retries: worth another go.
            error_type = ItemErrorType.PERMANENT if cause.non_retryable else ItemErrorType.TRANSIENT
        return error_type, cause.message, details
    if isinstance(cause, ActivityTimeoutError):
        kind = cause.type.name.lower() if cause.type else "unknown"
        return ItemErrorType.TRANSIENT, f"activity timed out ({kind})", DeliveryErrorDetails()
    return ItemErrorType.TRANSIENT, str(cause or err), DeliveryErrorDetails()
