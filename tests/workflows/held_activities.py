"""An interceptor that holds a worker's activities of one type (local ones too) while the test
says: a slow read model, or Temporal slow to take a change."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import activity
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor


class HoldActivities(Interceptor):
    """While `held`, each activity of `activity_type` takes `hold_s` longer before it runs."""

    def __init__(self, activity_type: str, hold_s: float, *, held: bool = False) -> None:
        self.activity_type = activity_type
        self.hold_s = hold_s
        self.held = held

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Held(next, self)


class _Held(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, hold: HoldActivities) -> None:
        super().__init__(next)
        self.hold = hold

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        if self.hold.held and activity.info().activity_type == self.hold.activity_type:
            await asyncio.sleep(self.hold.hold_s)
        return await super().execute_activity(input)
