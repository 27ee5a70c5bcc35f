"""The outbox item workflow: one item, from `queued` to `sent`, `failed` or `cancelled`.

Replaces a Durable Object row + alarm (docs/explanation/seeds.md): the row's state machine is
this workflow's state, `setAlarm(now + 10s)` is a durable timer, and the alarm's spacing as a
rate limit is the rate the Temporal server enforces on the destination's submit and poll task
queues.

The state machine itself is `workflows.delivery.Delivery`; this workflow hosts one (a
`DeliveryHost`: its submits and polls are activities of its own, shared with no other item), with
its own history, search attributes, current details and continue-as-new, and answers the item's
query, update and signals.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from durable_outbox_temporal.contract import search_attributes
    from durable_outbox_temporal.contract.item import (
        CANCEL_UPDATE,
        DELIVERY_REPORT_SIGNAL,
        REQUEST_CANCEL_SIGNAL,
        STATUS_QUERY,
        WORKFLOW_TYPE,
        CancelRequest,
        DeliveryReport,
        ItemProjection,
        ItemStatus,
        OutboxItemInput,
        OutboxItemView,
    )

    from activities.projection import ProjectionActivities
    from workflows.delivery import Delivery, DeliveryFailed
    from workflows.slow_local_activities import (
        READ_MODEL_WRITES_PATCH,
        SLOW_WRITE_TASKS_MEMO,
        SlowLocalActivities,
    )

# The read model must see every transition, so a projection is retried until the DB is back.
_PROJECTION_RETRIES = RetryPolicy(
    initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=30)
)


@workflow.defn(name=WORKFLOW_TYPE)
class OutboxItemWorkflow:
    """Delivers one outbox item: submit, poll the operation on durable timers, retry, report."""

    @workflow.init
    def __init__(self, item: OutboxItemInput) -> None:
        self._item = item
        self._delivery = Delivery(workflow.info().workflow_id, item, self)
        self._writes = SlowLocalActivities(READ_MODEL_WRITES_PATCH, SLOW_WRITE_TASKS_MEMO)

    @workflow.run
    async def run(self, item: OutboxItemInput) -> OutboxItemView:
        try:
            return await self._delivery.run()
        except DeliveryFailed as failure:
            raise ApplicationError(
                str(failure), failure.view, type=failure.error_type, non_retryable=True
            ) from None

    @workflow.query(name=STATUS_QUERY)
    def status(self) -> OutboxItemView:
        """The live view: status, attempts, last error, next attempt, operation, polls."""
        return self._delivery.view()

    @workflow.update(name=CANCEL_UPDATE)
    async def cancel(self, request: CancelRequest) -> OutboxItemView:
        """Cancel a queued item; returns the view once the cancel has taken effect or lost."""
        return await self._delivery.cancel(request)

    @cancel.validator
    def _validate_cancel(self, request: CancelRequest) -> None:
        self._delivery.validate_cancel()

    @workflow.signal(name=REQUEST_CANCEL_SIGNAL)
    def request_cancel(self, request: CancelRequest) -> None:
        """Cancel the item if it is still queued when the workflow sees this; else nothing."""
        self._delivery.request_cancel(request)

    @workflow.signal(name=DELIVERY_REPORT_SIGNAL)
    async def delivery_report(self, report: DeliveryReport) -> None:
        """Record the provider's report on one recipient; a repeat or an older report changes
        nothing."""
        await self._delivery.delivery_report(report)

    # -- DeliveryHost ------------------------------------------------------------------------

    async def project(self, projection: ItemProjection) -> None:
        """A local activity: no task of its own, written by the worker's group commit. Each
        workflow task that runs while it is out after the one it began in (a slow read model)
        upserts `tasks_while_read_model_slow` (`workflows/slow_local_activities.py`): a
        delivery report's handler records its event at `now()` there."""
        await self._writes.run(
            workflow.execute_local_activity_method(
                ProjectionActivities.project_item,
                projection,
                start_to_close_timeout=timedelta(seconds=10),
                retry_policy=_PROJECTION_RETRIES,
                summary="project to read model",
            )
        )

    def status_changed(self, status: ItemStatus) -> None:
        """Each upsert is a billable action and a visibility write, so `sending` is not
        upserted: the Web UI finds items in flight with `ExecutionStatus = 'Running'` (they show
        `OutboxStatus = 'queued'` until they end); the API and the read model have the status."""
        # Not `workflow.patched`: it upserts a search attribute of its own.
        if status.is_final or self._item.upsert_sending:
            workflow.upsert_search_attributes([search_attributes.OUTBOX_STATUS.value_set(status)])

    def show_details(self, lines: list[str]) -> None:
        workflow.set_current_details("\n\n".join(lines))

    async def wait(
        self, duration: timedelta, summary: str, until: Callable[[], bool] | None
    ) -> None:
        if until is None:
            await workflow.sleep(duration, summary=summary)
            return
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(until, timeout=duration, timeout_summary=summary)

    def gate(self, priority: int | None = None) -> None:
        """Nothing holds an item's own work back."""
        return None

    def release(self) -> None:
        """No slots to give back."""

    async def checkpoint(self, delivery: Delivery) -> None:
        """Continue as new when the history has grown long (an operation polled for hours)."""
        if workflow.info().is_continue_as_new_suggested():
            await delivery.project_pending()
            await workflow.wait_condition(workflow.all_handlers_finished)
            self._item.state = delivery.state
            workflow.continue_as_new(self._item)
