"""The ordering lane of item mode: the items of one `(outbox, ordering_key)`, in order.

A workflow of its own (`lane/{outbox}/{ordering_key}`), hosting one `workflows.ordering.Lane`
with the same machinery as a bulk shard (`workflows.host`): appends arrive as `append_items`
updates (update-with-start, so the first starts the lane), which the server serialises from any
number of API processes into the lane's history; that order is the delivery order. The lane runs
each item's delivery itself, one at a time, with the item's own submit and poll activities on
the destination's queues; each item's story is in the read model, and the lane's in the Web UI.
With a destination's `lane_run` above 1, up to that many of its items go in one submit
activity, one after another (a run, as in a bulk shard), held to the rate by its quota.

It carries its waiting items (keys and payloads, the policy once per destination) across
continue-as-new; appends past `LANE_MAX_WAITING_BYTES` are refused (`full`) so that carry always
fits in one Temporal payload. With nothing to do for its `idle_s`, it ends; the next append
starts it again.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from durable_outbox_temporal.contract import search_attributes
    from durable_outbox_temporal.contract.bulk import ShardInput
    from durable_outbox_temporal.contract.lane import LANE_WORKFLOW_TYPE, LaneStatus, LaneView

    from workflows.host import DeliveryHostWorkflow
    from workflows.ordering import Lane


@workflow.defn(name=LANE_WORKFLOW_TYPE)
class OutboxLaneWorkflow(DeliveryHostWorkflow):
    """Runs the items of one ordering key one at a time, in the order they were appended."""

    @workflow.run
    async def run(self, start: ShardInput) -> LaneView:
        await self._run()
        return self._only_lane().view()

    def run_length(self, destination: str) -> int:
        """The destination's `lane_run` (1 unless an append said otherwise): the lane's submits
        go in activities of that many while its items to that destination run. A run is one
        activity on the submit queue, so the destination's quota holds its requests to the
        rate (`durable_outbox_temporal.destinations`; docs/decisions/lanes-in-the-host.md)."""
        length = self._lane_runs.get(destination, 1)
        # Only this lane submits here, one run at a time: the size is its current run's.
        self._submits.size = length
        return length

    def _only_lane(self) -> Lane:
        assert len(self._lanes) == 1, "an item-mode lane workflow holds exactly one lane"
        return next(iter(self._lanes.values()))

    def lane_changed(self, lane: Lane) -> None:
        super().lane_changed(lane)
        self._show_details()

    def _lanes_projected(self) -> None:
        """The `LaneState` search attribute follows the lane's status (once per change)."""
        status = self._only_lane().status()
        if status is not self._status_attribute:
            self._status_attribute = status
            workflow.upsert_search_attributes([search_attributes.LANE_STATE.value_set(status)])

    _status_attribute: LaneStatus | None = LaneStatus.RUNNING

    def _show_details(self) -> None:
        if self._lanes:
            workflow.set_current_details("\n\n".join(self._only_lane().details()))
