"""Local activities a workflow awaits, and a command for each workflow task that runs while one
begun in an earlier task is still out.

A workflow task waiting on a local activity is completed at four fifths of its timeout (8 s by
default) with whatever commands it has, and the next one is scheduled at once. The SDK core
replays a task that sent no command, after another such, together with the next one and under a
later time (temporalio/sdk-rust#1606), so a decision taken from `workflow.now()` in such a task
(a signal handler's, a wait's end) can come out otherwise on a worker replaying the run. A memo
upsert gives each task that runs in such a stretch a command of its own; a local activity that
ends in the task it began in (the common case) marks nothing.
Why: docs/decisions/aggregate-passivation.md
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable
from typing import TypeVar

from temporalio import workflow

Result = TypeVar("Result")

# A workflow whose local activities write the read model (a bulk shard's host, an item-mode
# item) marks from this patch on, and counts its marked tasks in this memo entry; runs from
# before replay without the upserts.
READ_MODEL_WRITES_PATCH = "tasks-marked-while-read-model-slow"
SLOW_WRITE_TASKS_MEMO = "tasks_while_read_model_slow"


class SlowLocalActivities:
    """Wraps a workflow's awaits of its local activities (`run`); counts, in the memo entry
    `memo`, the run's tasks that ran while one begun in an earlier task was out. Runs recorded
    before `patch` replay without the upserts."""

    def __init__(self, patch: str, memo: str) -> None:
        self._patch, self._memo = patch, memo
        self._out = 0
        self._watching = False
        self.marked = 0

    async def run(self, local_activity: Awaitable[Result]) -> Result:
        self._out += 1
        if not self._watching:
            self._watching = True
            asyncio.create_task(self._mark_tasks_while_out())
        try:
            return await local_activity
        finally:
            self._out -= 1

    async def _mark_tasks_while_out(self) -> None:
        try:
            task = workflow.info().get_current_history_length()
            while True:
                await workflow.wait_condition(functools.partial(self._new_task_or_none_out, task))
                if not self._out:
                    return
                task = workflow.info().get_current_history_length()
                if workflow.patched(self._patch):
                    self.marked += 1
                    workflow.upsert_memo({self._memo: self.marked})
        finally:
            self._watching = False

    def _new_task_or_none_out(self, began: int) -> bool:
        """A workflow task after the one at history length `began` runs, or none is out."""
        return not self._out or workflow.info().get_current_history_length() != began
