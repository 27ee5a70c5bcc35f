"""A destination's flow: the durable side of its throttle rule (`flowcontrol.throttle`).

One per destination (`flow/{name}`), started by the first submit that meets a throttle and
signalled by every one after it. It sleeps on a durable timer until the pause's end, resumes
the submit queue (a local activity: one RPC to the server), steps a halved rate back up, and
ends once the rate is whole again and no throttle came for a while. A worker killed meanwhile
changes nothing: the timer and the state are in the history.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.flow import apply_flow_rate
    from contract.flow import (
        FLOW_QUERY,
        FLOW_WORKFLOW_TYPE,
        THROTTLED_SIGNAL,
        FlowState,
        Throttled,
    )
    from flowcontrol import throttle

# Idle this long with the rate whole, the flow ends (the next throttle starts it again).
LINGER = timedelta(minutes=5)
# Temporal briefly unreachable from the worker: tried again, for as long as it takes.
_RETRIES = RetryPolicy(
    initial_interval=timedelta(seconds=0.2), maximum_interval=timedelta(seconds=5)
)


@workflow.defn(name=FLOW_WORKFLOW_TYPE)
class DestinationFlowWorkflow:
    @workflow.init
    def __init__(self, state: FlowState) -> None:
        self._state = state
        self._seen = 0
        self._seen_before = 0

    def _another_throttle(self) -> bool:
        return self._seen != self._seen_before

    @workflow.signal(name=THROTTLED_SIGNAL)
    def throttled(self, seen: Throttled) -> None:
        throttle.on_throttled(self._state, seen, workflow.now())
        self._seen += 1

    @workflow.query(name=FLOW_QUERY)
    def flow(self) -> FlowState:
        return self._state

    @workflow.run
    async def run(self, state: FlowState) -> FlowState:
        while not workflow.info().is_continue_as_new_suggested():
            self._seen_before = self._seen
            due = throttle.due(self._state)
            if due is None or due > workflow.now():
                wait = LINGER if due is None else due - workflow.now()
                try:
                    await workflow.wait_condition(self._another_throttle, timeout=wait)
                    continue  # another throttle: the due time may have moved
                except TimeoutError:
                    pass
            change = throttle.next_change(self._state, workflow.now())
            if change is None:
                if throttle.due(self._state) is None:
                    break  # idle, the rate whole
                continue
            result = await workflow.execute_local_activity(
                apply_flow_rate,
                change,
                start_to_close_timeout=timedelta(seconds=10),
                retry_policy=_RETRIES,
            )
            throttle.applied(self._state, change, result, workflow.now())
        await workflow.wait_condition(workflow.all_handlers_finished)
        if throttle.due(self._state) is not None:
            # A throttle came as the flow was ending, or the history grew long: go on anew.
            workflow.continue_as_new(self._state)
        return self._state
