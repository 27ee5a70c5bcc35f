"""Rates and pauses of activity task queues, enforced and stored by the Temporal server.

What the server does, as measured (docs/decisions/pause-as-zero-rate.md):
`UpdateTaskQueueConfig` on an activity task queue sets a queue rate limit that overrides the
rate the workers ask for (`max_task_queue_activities_per_second`), across every worker, and is
kept in Temporal's own database, so it survives restarts of every process. A limit of 0 stops
dispatch altogether: activities in flight finish, scheduled ones wait, nothing fails. Unsetting
it returns the queue to the workers' (configured) rate. So a pause is a zero limit on a queue.

The one place these primitives live: the API's destination controls (`service.destinations`)
and the submit activity (which pauses a destination whose endpoint answers 410 Gone) share them.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from temporalio.api.enums.v1 import RateLimitSource, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    DescribeTaskQueueRequest,
    UpdateTaskQueueConfigRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

# A describe the server cancelled (as it does under load: "operation was canceled") is asked
# again after these waits before its error goes to the caller: a read changes nothing, and one
# such cancel made a destination's PATCH answer 503 in a loaded test run.
_CANCELLED_READ_WAITS_S = (0.05, 0.2)
# The longest pause reason kept (the API refuses longer ones; automatic ones are cut to it).
MAX_REASON = 500
# A paused queue's limit reason records the run-time rate to restore on resume, if there was one.
_PAUSED = re.compile(r"^paused; resume at (?P<rate>[0-9.]+|configured)/s; (?P<reason>.*)$", re.S)
# A pause a throttle caused (`flowcontrol.throttle`) says until when, in its reason.
_THROTTLED = re.compile(r"^throttled until (?P<until>\S+?): ")
# A pause an open circuit caused (`flowcontrol.breaker`) says since when, in its reason.
CIRCUIT_PREFIX = "circuit open since "
_CIRCUIT = re.compile(rf"^{CIRCUIT_PREFIX}(?P<since>\S+?): ")
# A pause that disables a destination failing too long (`flowcontrol.disable`), or by hand.
DISABLED_PREFIX = "disabled since "
# The reason an adaptive destination's rate carries (`flowcontrol.adaptive`): a later run of its
# flow knows the rate for its own, not an operator's.
ADAPTIVE_REASON = "adaptive rate: "
_DISABLED = re.compile(rf"^{DISABLED_PREFIX}(?P<since>\S+?): ")


@dataclass
class QueueRate:
    """The rate a task queue is held to now, and who set it."""

    rate: float
    # "api" (set at run time; 0 while paused) or "worker" (the destinations file's rate).
    source: str
    paused: bool = False
    pause_reason: str | None = None
    resume_rate: float | None = None
    # Paused by a throttle until then (`flowcontrol.throttle`); None for any other pause.
    paused_until: datetime | None = None
    # Paused by the destination's open circuit since then (`flowcontrol.breaker`).
    circuit_open_since: datetime | None = None
    # Disabled since then (`flowcontrol.disable`): paused until an operator re-enables it.
    disabled_since: datetime | None = None
    # The reason the rate limit was set with (a pause's, or a run-time rate's).
    reason: str | None = None


async def read_queue_rate(
    client: Client, task_queue: str, *, rpc_timeout: timedelta | None = None
) -> QueueRate:
    """The rate the server holds an activity task queue to, and whether it is paused: a limit
    set through the API from the moment it is set."""
    request = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=task_queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
        report_config=True,
    )
    for wait_s in (*_CANCELLED_READ_WAITS_S, None):
        try:
            response = await client.workflow_service.describe_task_queue(
                request, timeout=rpc_timeout
            )
            break
        except RPCError as err:
            if err.status != RPCStatusCode.CANCELLED or wait_s is None:
                raise
        await asyncio.sleep(wait_s)
    effective = response.effective_rate_limit
    queue_limit = response.config.queue_rate_limit
    if queue_limit.HasField("rate_limit"):
        # A limit set through the API is the rate in force: the server stores it at once and
        # applies it to its queues a moment later, while the effective rate it reports still
        # shows the workers' (an answer to a change, or a read just after one, would not show
        # the change, and a 410 pausing its destination would not see an operator's pause).
        configured = queue_limit.rate_limit.requests_per_second
        rate = QueueRate(
            rate=configured,
            source="api",
            paused=configured == 0,
            reason=queue_limit.metadata.reason or None,
        )
    else:
        from_api = effective.rate_limit_source == RateLimitSource.RATE_LIMIT_SOURCE_API
        rate = QueueRate(rate=effective.requests_per_second, source="api" if from_api else "worker")
    if rate.paused:
        match = _PAUSED.match(queue_limit.metadata.reason)
        if match:
            rate.pause_reason = match["reason"]
            rate.resume_rate = None if match["rate"] == "configured" else float(match["rate"])
        else:
            rate.pause_reason = queue_limit.metadata.reason or "paused"
        throttled = _THROTTLED.match(rate.pause_reason)
        if throttled:
            with contextlib.suppress(ValueError):
                rate.paused_until = datetime.fromisoformat(throttled["until"])
        circuit = _CIRCUIT.match(rate.pause_reason)
        if circuit:
            with contextlib.suppress(ValueError):
                rate.circuit_open_since = datetime.fromisoformat(circuit["since"])
        disabled = _DISABLED.match(rate.pause_reason)
        if disabled:
            with contextlib.suppress(ValueError):
                rate.disabled_since = datetime.fromisoformat(disabled["since"])
    return rate


def circuit_reason(since: datetime, detail: str) -> str:
    """The pause reason an open circuit leaves on its submit queue."""
    return f"{CIRCUIT_PREFIX}{since.astimezone(UTC).isoformat()}: {detail}"[:MAX_REASON]


def disabled_reason(since: datetime, detail: str) -> str:
    """The pause reason a disabled destination's submit queue carries."""
    return f"{DISABLED_PREFIX}{since.astimezone(UTC).isoformat()}: {detail}"[:MAX_REASON]


async def set_queue_rate(
    client: Client,
    task_queue: str,
    rate: float | None,
    reason: str,
    *,
    identity: str,
    rpc_timeout: timedelta | None = None,
) -> None:
    """Set (or with None, unset: back to the workers' rate) the queue's rate limit."""
    request = UpdateTaskQueueConfigRequest(
        namespace=client.namespace,
        identity=identity,
        task_queue=task_queue,
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
    )
    request.update_queue_rate_limit.reason = reason
    if rate is not None:
        request.update_queue_rate_limit.rate_limit.requests_per_second = rate
    await client.workflow_service.update_task_queue_config(request, timeout=rpc_timeout)


async def pause_queue(
    client: Client,
    task_queue: str,
    now: QueueRate,
    reason: str,
    *,
    identity: str,
    resume_rate: float | None = None,
    rpc_timeout: timedelta | None = None,
) -> None:
    """Hold the queue at zero, remembering the rate a resume restores: `resume_rate` if given,
    else the one an earlier pause remembered, else a run-time rate in force, else the
    configured one."""
    if resume_rate is None:
        resume_rate = now.resume_rate if now.paused else (now.rate if now.source == "api" else None)
    remembered = "configured" if resume_rate is None else f"{resume_rate:g}"
    text = f"paused; resume at {remembered}/s; {reason}"
    await set_queue_rate(client, task_queue, 0.0, text, identity=identity, rpc_timeout=rpc_timeout)


async def restore_queue(
    client: Client,
    task_queue: str,
    before: QueueRate,
    *,
    identity: str,
    rpc_timeout: timedelta | None = None,
) -> None:
    """Put the queue back as `before` read it: paused with its reason and the rate a resume
    restores, or at its run-time rate, or at the workers' rate."""
    if before.paused:
        await pause_queue(
            client,
            task_queue,
            before,
            before.pause_reason or "paused",
            identity=identity,
            resume_rate=before.resume_rate,
            rpc_timeout=rpc_timeout,
        )
    else:
        rate = before.rate if before.source == "api" else None
        reason = "put back: a change to it did not complete"
        await set_queue_rate(
            client, task_queue, rate, reason, identity=identity, rpc_timeout=rpc_timeout
        )


async def pause_queues_not_paused(
    client: Client, task_queues: list[str], reason: str, *, identity: str
) -> list[str]:
    """Pause each of `task_queues` that is not paused already; returns the ones it paused.

    A queue already paused keeps its reason: an operator's, or the first automatic one.
    """
    paused = []
    for task_queue in task_queues:
        now = await read_queue_rate(client, task_queue)
        if not now.paused:
            await pause_queue(client, task_queue, now, reason[:MAX_REASON], identity=identity)
            paused.append(task_queue)
    return paused


async def throttle_queue(
    client: Client, task_queue: str, until: datetime, cause: str, *, identity: str
) -> bool:
    """Pause the queue until `until` for a throttle; whether it did. A queue paused by hand (or
    by a 410) stays as it is, and so does one a throttle paused for longer."""
    now = await read_queue_rate(client, task_queue)
    if now.paused and (now.paused_until is None or now.paused_until >= until):
        return False
    reason = f"throttled until {until.astimezone(UTC).isoformat()}: {cause}"
    await pause_queue(client, task_queue, now, reason[:MAX_REASON], identity=identity)
    return True
