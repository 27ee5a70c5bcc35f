"""The outbox item workflow: one item, from `queued` to `sent`, `failed` or `cancelled`.

Replaces the seed's Durable Object row + alarm: the row's state machine is this workflow's state,
`setAlarm(now + 10s)` is a durable timer, and the alarm's spacing as a rate limit is the rate the
Temporal server enforces on the destination's submit and poll task queues.

Retries of *classified* provider failures are driven here rather than by Temporal's activity
retry policy, so the status query can show attempts, the last error and the next attempt time,
and so `Retry-After` is honoured exactly. Temporal still retries what only infrastructure can
cause (a worker killed mid-activity, an unexpected exception) a few times.

Submits and polls carry the outbox as their fairness key: on a server with fairness on, the
destination's queues share their rate between outboxes, so one outbox's backlog does not hold
another's items behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.common import Priority, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as ActivityTimeoutError

with workflow.unsafe.imports_passed_through():
    from activities.delivery import DeliveryActivities
    from activities.projection import ProjectionActivities
    from contract import search_attributes
    from contract.ids import outbox_fairness_key, provider_idempotency_key
    from contract.item import (
        CANCEL_UPDATE,
        DELIVERY_REPORT_SIGNAL,
        REQUEST_CANCEL_SIGNAL,
        STATUS_QUERY,
        WORKFLOW_TYPE,
        CancelRequest,
        DeliveryErrorDetails,
        DeliveryReport,
        ItemErrorType,
        ItemEvent,
        ItemEventType,
        ItemProjection,
        ItemStatus,
        OperationStatus,
        OutboxItemInput,
        OutboxItemState,
        OutboxItemView,
        PollRequest,
        PollResult,
        Recipient,
        SubmitRequest,
        apply_delivery_report,
    )

# Our own classified errors come back to the workflow at once; anything else (a worker killed
# mid-request, a bug) Temporal retries a few times before the workflow counts it as an attempt.
_INFRASTRUCTURE_RETRIES = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_attempts=3,
    non_retryable_error_types=[ItemErrorType.TRANSIENT, ItemErrorType.PERMANENT],
)
# The read model must see every transition, so a projection is retried until the DB is back.
_PROJECTION_RETRIES = RetryPolicy(
    initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=30)
)
# Reports for a message the item has not yet recorded as accepted (the provider can be faster
# than the submit activity's answer), kept until it has; bounded against a flood of strays.
_MAX_EARLY_REPORTS = 100


class _DeliveryFailed(Exception):
    """Raised inside the workflow to end it failed; converted to an ApplicationError in `run`."""

    def __init__(
        self, message: str, error_type: ItemErrorType, error_code: str | None = None
    ) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.error_code = error_code


@workflow.defn(name=WORKFLOW_TYPE)
class OutboxItemWorkflow:
    """Delivers one outbox item: submit, poll the operation on durable timers, retry, report."""

    @workflow.init
    def __init__(self, item: OutboxItemInput) -> None:
        self._item = item
        self._state = item.state or OutboxItemState()
        self._early_reports: list[DeliveryReport] = []
        self._reports_closed = False

    @workflow.run
    async def run(self, item: OutboxItemInput) -> OutboxItemView:
        state = self._state
        if not state.started:
            state.started = True
            state.created_at = state.created_at or item.enqueued_at or workflow.now()
            if state.last_event_seq:
                self._record(ItemEventType.REDRIVEN, ItemStatus.QUEUED, "redriven after failure")
            else:
                self._record(ItemEventType.ENQUEUED, ItemStatus.QUEUED, self._describe_enqueue())
            await self._project()
        try:
            if state.status is ItemStatus.QUEUED:
                await self._submit_until_accepted()
            if state.status is ItemStatus.SENDING:
                await self._poll_until_done()
            if state.status is ItemStatus.SENT:
                await self._listen_for_reports()
        except _DeliveryFailed as failure:
            self._state.last_error_code = failure.error_code
            await self._finish(ItemStatus.FAILED, ItemEventType.FAILED, str(failure))
            raise ApplicationError(
                str(failure), self.view(), type=failure.error_type, non_retryable=True
            ) from None
        except asyncio.CancelledError:
            # Cancelled from Temporal itself (Web UI, CLI): record it, then let Temporal end the
            # workflow as cancelled.
            if not state.status.is_final:
                await self._finish(
                    ItemStatus.CANCELLED, ItemEventType.CANCELLED, "workflow cancelled"
                )
            raise
        return self.view()

    @workflow.query(name=STATUS_QUERY)
    def status(self) -> OutboxItemView:
        """The live view: status, attempts, last error, next attempt, operation, polls."""
        return self.view()

    @workflow.update(name=CANCEL_UPDATE)
    async def cancel(self, request: CancelRequest) -> OutboxItemView:
        """Cancel a queued item; returns the view once the cancel has taken effect or lost."""
        if not self._state.cancel_requested:
            self._state.cancel_requested = True
            self._state.cancel_reason = request.reason
        # Returns once the submit loop has acted on it: `cancelled`, or `sending`/`sent` if a
        # submit already in flight won the race (the caller reports that as too late).
        await workflow.wait_condition(lambda: self._state.status is not ItemStatus.QUEUED)
        return self.view()

    @workflow.signal(name=REQUEST_CANCEL_SIGNAL)
    def request_cancel(self, request: CancelRequest) -> None:
        """Cancel the item if it is still queued when the workflow sees this; else nothing."""
        if self._state.status is ItemStatus.QUEUED and not self._state.cancel_requested:
            self._state.cancel_requested = True
            self._state.cancel_reason = request.reason

    @workflow.signal(name=DELIVERY_REPORT_SIGNAL)
    async def delivery_report(self, report: DeliveryReport) -> None:
        """Record the provider's report on one recipient; a repeat or an older report changes
        nothing. Applied while sending too: the report may beat the poll that sees success."""
        state = self._state
        if self._reports_closed or self._item.policy.report_window_s <= 0:
            return
        if state.provider_message_id is None and not state.status.is_final:
            if len(self._early_reports) < _MAX_EARLY_REPORTS:
                self._early_reports.append(report)
            return
        if report.message_id != state.provider_message_id:
            return  # another generation's message, or a stray
        changed = apply_delivery_report(state.recipients, report)
        if changed is None:
            return
        detail = f"{changed.address}: {changed.status.value}"
        if changed.detail:
            detail += f" ({changed.detail})"
        self._record(ItemEventType.DELIVERY_REPORT, state.status, detail)
        self._show_details(f"Delivery report: {detail}.")
        await self._project()

    @cancel.validator
    def _validate_cancel(self, request: CancelRequest) -> None:
        if self._state.status is not ItemStatus.QUEUED:
            raise ApplicationError(
                f"item is {self._state.status.value}; only queued items can be cancelled",
                type=ItemErrorType.CANNOT_CANCEL,
            )

    def view(self) -> OutboxItemView:
        """The item as the API, the query and the read model show it."""
        return OutboxItemView.of(workflow.info().workflow_id, self._item, self._state)

    async def _submit_until_accepted(self) -> None:
        item, state, policy = self._item, self._state, self._item.policy
        while True:
            if state.cancel_requested:
                await self._finish(
                    ItemStatus.CANCELLED, ItemEventType.CANCELLED, state.cancel_reason
                )
                return
            state.attempts += 1
            state.next_attempt_at = None
            self._show_details(f"Submitting, attempt {state.attempts}/{policy.max_attempts}.")
            try:
                result = await workflow.execute_activity_method(
                    DeliveryActivities.submit_item,
                    SubmitRequest(
                        destination=item.destination,
                        item_id=workflow.info().workflow_id,
                        idempotency_key=provider_idempotency_key(
                            workflow.info().workflow_id, item.generation
                        ),
                        payload=item.payload,
                        attempt=state.attempts,
                    ),
                    task_queue=policy.submit_task_queue,
                    start_to_close_timeout=timedelta(seconds=policy.submit_timeout_s),
                    retry_policy=_INFRASTRUCTURE_RETRIES,
                    summary=f"submit to {item.destination}, attempt {state.attempts}",
                    priority=self._priority(),
                )
            except ActivityError as err:
                error_type, message, details = _classify(err)
                if error_type is ItemErrorType.DESTINATION_GONE:
                    await self._wait_for_resume(message)
                    continue
                if error_type is not ItemErrorType.TRANSIENT:
                    raise _DeliveryFailed(
                        message, ItemErrorType.PERMANENT, details.error_code
                    ) from None
                if state.attempts >= policy.max_attempts:
                    raise _DeliveryFailed(
                        f"gave up after {state.attempts} attempts: {message}",
                        ItemErrorType.DELIVERY_FAILED,
                        details.error_code,
                    ) from None
                await self._wait_before_retry(message, details.retry_after_s)
                continue
            state.provider_message_id = result.provider_message_id
            if policy.report_window_s > 0:
                self._expect_reports_on(result.recipients)
            if result.delivered:
                await self._finish(ItemStatus.SENT, ItemEventType.SENT, "delivered")
                return
            state.operation_url = result.operation_url
            state.operation_started_at = workflow.now()
            state.next_attempt_at = workflow.now() + timedelta(
                seconds=self._first_poll_delay(result.retry_after_s)
            )
            self._record(
                ItemEventType.ACCEPTED, ItemStatus.SENDING, f"operation {result.operation_url}"
            )
            await self._project()
            return

    def _priority(self) -> Priority:
        """Fairness between outboxes on the destination's queues (see the module docstring)."""
        return Priority(fairness_key=outbox_fairness_key(self._item.outbox))

    async def _wait_for_resume(self, message: str) -> None:
        """The endpoint answered 410 Gone and the submit paused the destination: record it and
        take the attempt back. The next submit then waits in the paused queue until an operator
        resumes the destination; the short timer first keeps a pause that somehow does not hold
        from turning this into a busy loop, and lets a cancel in."""
        state, policy = self._state, self._item.policy
        state.last_error = message
        state.next_attempt_at = None
        self._record(ItemEventType.DESTINATION_GONE, ItemStatus.QUEUED, message)
        state.attempts -= 1
        await self._project()
        self._show_details(f"{message}. Waiting for the destination to be resumed.")
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(
                lambda: state.cancel_requested,
                timeout=timedelta(seconds=policy.backoff_initial_s),
                timeout_summary="destination paused: 410 Gone",
            )

    def _expect_reports_on(self, addresses: list[str]) -> None:
        """Track each address as `pending`, then apply what arrived before the accept did."""
        state = self._state
        known = {recipient.address.casefold() for recipient in state.recipients}
        for address in addresses:
            if address.casefold() not in known:
                known.add(address.casefold())
                state.recipients.append(Recipient(address=address))
        early, self._early_reports = self._early_reports, []
        for report in early:
            if report.message_id == state.provider_message_id:
                apply_delivery_report(state.recipients, report)

    async def _listen_for_reports(self) -> None:
        """Stay open for delivery reports until every recipient has settled or the window ends.

        A durable timer: the window outlives worker restarts and deploys like any other wait.
        """
        state, window_s = self._state, self._item.policy.report_window_s
        if window_s > 0 and state.recipients and state.finished_at is not None:
            until = state.finished_at + timedelta(seconds=window_s)
            remaining = until - workflow.now()
            if remaining > timedelta(0) and not self._all_recipients_settled():
                self._show_details(
                    f"Listening for delivery reports until {until:%Y-%m-%d %H:%M} UTC."
                )
                with contextlib.suppress(TimeoutError):
                    await workflow.wait_condition(
                        self._all_recipients_settled,
                        timeout=remaining,
                        timeout_summary="delivery report window",
                    )
        self._reports_closed = True
        # A report being projected finishes before the item's final result is taken.
        await workflow.wait_condition(workflow.all_handlers_finished)

    def _all_recipients_settled(self) -> bool:
        return all(recipient.status.settled for recipient in self._state.recipients)

    async def _wait_before_retry(self, message: str, retry_after_s: float | None) -> None:
        state, policy = self._state, self._item.policy
        if retry_after_s is not None:
            # The provider said when; coming back earlier only earns another 429.
            delay = retry_after_s
            why = f"Retry-After {retry_after_s:g}s"
        else:
            backoff = min(
                policy.backoff_initial_s * policy.backoff_multiplier ** (state.attempts - 1),
                policy.backoff_max_s,
            )
            delay = backoff * (1 + policy.backoff_jitter * workflow.random().random())
            why = f"backoff {delay:.1f}s"
        state.last_error = message
        state.next_attempt_at = workflow.now() + timedelta(seconds=delay)
        self._record(ItemEventType.SUBMIT_FAILED, ItemStatus.QUEUED, f"{message} ({why})")
        await self._project()
        self._show_details(f"Attempt {state.attempts} failed: {message}. Retrying after {why}.")
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(
                lambda: state.cancel_requested,
                timeout=timedelta(seconds=delay),
                timeout_summary=f"retry after {why}",
            )

    async def _poll_until_done(self) -> None:
        state, policy = self._state, self._item.policy
        assert state.operation_url is not None and state.operation_started_at is not None
        deadline = state.operation_started_at + timedelta(seconds=policy.poll_deadline_s)
        while True:
            now = workflow.now()
            if now >= deadline:
                raise _DeliveryFailed(
                    f"operation timed out: still running after {policy.poll_deadline_s:g}s",
                    ItemErrorType.DELIVERY_FAILED,
                )
            wake_at = min(state.next_attempt_at or now, deadline)
            self._show_details(f"Operation accepted; next poll at {wake_at:%H:%M:%S} UTC.")
            if wake_at > now:
                await workflow.sleep(wake_at - now, summary=f"next poll #{state.poll_count + 1}")
            if workflow.now() >= deadline:
                continue
            result = await self._poll_once()
            if result is not None and result.status is OperationStatus.SUCCEEDED:
                await self._finish(ItemStatus.SENT, ItemEventType.SENT, "operation succeeded")
                return
            if result is not None and result.status in (
                OperationStatus.FAILED,
                OperationStatus.CANCELED,
            ):
                raise _DeliveryFailed(
                    result.error or f"operation {result.status.value}",
                    ItemErrorType.DELIVERY_FAILED,
                    result.error_code,
                )
            if workflow.info().is_continue_as_new_suggested():
                await self._project()
                await workflow.wait_condition(workflow.all_handlers_finished)
                self._item.state = state
                workflow.continue_as_new(self._item)

    async def _poll_once(self) -> PollResult | None:
        """One poll; a transient poll failure is logged and the next poll is scheduled."""
        item, state, policy = self._item, self._state, self._item.policy
        state.poll_count += 1
        try:
            result = await workflow.execute_activity_method(
                DeliveryActivities.poll_operation,
                PollRequest(
                    destination=item.destination,
                    item_id=workflow.info().workflow_id,
                    operation_url=state.operation_url or "",
                ),
                task_queue=policy.poll_task_queue,
                start_to_close_timeout=timedelta(seconds=policy.poll_timeout_s),
                retry_policy=_INFRASTRUCTURE_RETRIES,
                summary=f"poll operation #{state.poll_count}",
                priority=self._priority(),
            )
        except ActivityError as err:
            error_type, message, details = _classify(err)
            # A gone endpoint (the destination is paused now) is polled again, after the resume.
            if error_type is ItemErrorType.PERMANENT:
                raise _DeliveryFailed(
                    f"poll failed: {message}", ItemErrorType.PERMANENT, details.error_code
                ) from None
            state.last_error = f"poll failed: {message}"
            self._schedule_next_poll(details.retry_after_s)
            self._record(ItemEventType.POLLED, ItemStatus.SENDING, state.last_error)
            await self._project()
            return None
        if result.status in (OperationStatus.RUNNING, OperationStatus.NOT_STARTED):
            self._schedule_next_poll(result.retry_after_s)
            self._record(ItemEventType.POLLED, ItemStatus.SENDING, result.status.value)
            await self._project()
        return result

    def _schedule_next_poll(self, retry_after_s: float | None) -> None:
        policy = self._item.policy
        if retry_after_s is not None:
            delay = retry_after_s
        else:
            delay = min(
                policy.poll_interval_s
                * policy.poll_backoff_multiplier ** max(self._state.poll_count - 1, 0),
                policy.poll_interval_max_s,
            )
        self._state.next_attempt_at = workflow.now() + timedelta(seconds=delay)

    def _first_poll_delay(self, retry_after_s: float | None) -> float:
        return self._item.policy.poll_interval_s if retry_after_s is None else retry_after_s

    async def _finish(self, status: ItemStatus, event: ItemEventType, detail: str | None) -> None:
        state = self._state
        if status is ItemStatus.FAILED:
            state.last_error = detail
        state.next_attempt_at = None
        state.finished_at = workflow.now()
        self._record(event, status, detail)
        self._show_details(f"{status.value.capitalize()}: {detail}.")
        await self._project()

    def _record(self, event: ItemEventType, status: ItemStatus, detail: str | None) -> None:
        """Apply a transition: state, event history and, when the item ends, its search
        attribute. Each upsert is a billable action and a visibility write, so `sending` is not
        upserted: the Web UI finds items in flight with `ExecutionStatus = 'Running'` (they show
        `OutboxStatus = 'queued'` until they end); the API and the read model have the status."""
        state = self._state
        if status is not state.status:
            state.status = status
            # Not `workflow.patched`: it upserts a search attribute of its own.
            if status.is_final or self._item.upsert_sending:
                workflow.upsert_search_attributes(
                    [search_attributes.OUTBOX_STATUS.value_set(status)]
                )
        state.updated_at = workflow.now()
        state.last_event_seq += 1
        state.events.append(
            ItemEvent(
                seq=state.last_event_seq,
                type=event,
                status=status,
                at=state.updated_at,
                attempt=state.attempts,
                detail=detail,
                error_code=state.last_error_code if status is ItemStatus.FAILED else None,
            )
        )

    async def _project(self) -> None:
        """Write the transitions not yet in the read model (a local activity, so it is cheap)."""
        state = self._state
        if not state.events:
            return
        sent = list(state.events)
        starts_item = sent[0].type in (ItemEventType.ENQUEUED, ItemEventType.REDRIVEN)
        await workflow.execute_local_activity_method(
            ProjectionActivities.project_item,
            ItemProjection(
                view=self.view(),
                events=sent,
                enqueued_at=self._item.enqueued_at,
                payload=self._item.payload if starts_item else None,
            ),
            start_to_close_timeout=timedelta(seconds=10),
            retry_policy=_PROJECTION_RETRIES,
            summary="project to read model",
        )
        # Projected events live on in the read model; dropping them keeps the state carried
        # across continue-as-new small however long an operation is polled. Only the ones sent:
        # a signal handler may have recorded more (and projected them) meanwhile.
        projected = {event.seq for event in sent}
        state.events[:] = [event for event in state.events if event.seq not in projected]

    def _show_details(self, line: str) -> None:
        state, policy = self._state, self._item.policy
        lines = [
            f"**{state.status.value}** — {self._item.destination}, outbox `{self._item.outbox}`",
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
        workflow.set_current_details("\n\n".join(lines))

    def _describe_enqueue(self) -> str:
        item = self._item
        if item.not_before is not None:
            return f"to {item.destination}, not before {item.not_before.isoformat()}"
        return f"to {item.destination}"


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
