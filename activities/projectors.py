"""The async projectors' runner: one long-running activity per projector, heartbeating.

It applies batches as events arrive (polling the event store every `poll_interval_s` when idle),
backs off after a failure (doubling up to `max_backoff_s`) and counts it; a projector faulted
after five consecutive failures is only watched until a rebuild sets it running again. If the
worker dies the heartbeat stops and Temporal runs the activity on another worker; the batch's
transaction holds the checkpoint, so even two runners at once never apply an event twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping

from durable_outbox_temporal.contract.projector import RUN_ACTIVITY
from sqlalchemy import Engine
from temporalio import activity
from temporalio.exceptions import ApplicationError

from readmodel.projectors import base as projectors
from readmodel.projectors.base import BATCH, AsyncProjector

log = logging.getLogger("outbox.projectors")


class ProjectorActivities:
    """Runs `registry`'s projectors (the registered aggregate types', by name) against `engine`;
    the intervals are the tests' to shorten."""

    def __init__(
        self,
        engine: Engine,
        registry: Mapping[str, AsyncProjector],
        *,
        poll_interval_s: float = 0.5,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        run_s: float = 3600.0,
    ) -> None:
        self._engine = engine
        self._registry = dict(registry)
        self._poll_interval_s = poll_interval_s
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._run_s = run_s

    @activity.defn(name=RUN_ACTIVITY)
    async def run_projector(self, name: str) -> None:
        """Project for `run_s` (an hour), then return for the workflow to run it again; sooner
        when its worker begins to stop, and until cancelled (the workflow is terminated)."""
        projector = self._registry.get(name)
        if projector is None:
            raise ApplicationError(f"no projector {name!r}", non_retryable=True)
        backoff = self._backoff_s
        deadline = asyncio.get_running_loop().time() + self._run_s
        # A stopping worker hands the runner back between batches: the workflow runs it again
        # on another worker, instead of the shutdown's grace running out on a loop that never ends.
        while asyncio.get_running_loop().time() < deadline and not activity.is_worker_shutdown():
            activity.heartbeat()
            try:
                applied = await asyncio.to_thread(
                    projectors.project_batch, self._engine, projector, BATCH
                )
            except Exception as err:
                error = f"{type(err).__name__}: {err}"
                status = await asyncio.to_thread(
                    projectors.record_failure, self._engine, name, error
                )
                log.warning("projector %s failed (%s): %s", name, status, error)
                await _pause(backoff)
                backoff = min(backoff * 2, self._max_backoff_s)
                continue
            backoff = self._backoff_s
            if applied < BATCH:
                await _pause(self._poll_interval_s)


async def _pause(seconds: float) -> None:
    """Sleep, heartbeating three times per heartbeat timeout: the longest back-off (30 s) is as
    long as the workflow's heartbeat timeout, and must not look like a dead worker to Temporal.
    Wakes at once when the worker begins to stop."""
    timeout = activity.info().heartbeat_timeout
    slice_s = timeout.total_seconds() / 3 if timeout else seconds
    loop = asyncio.get_running_loop()
    wake_at = loop.time() + seconds
    while (left := wake_at - loop.time()) > 0 and not activity.is_worker_shutdown():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(activity.wait_for_worker_shutdown(), min(left, slice_s))
        activity.heartbeat()
