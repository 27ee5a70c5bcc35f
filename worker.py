"""The worker process: item workflows, plus a submit and a poll worker per destination, and an
operations worker (scheduled fan-out, dead-letter redrive batches, aggregate effects, the async
projectors' runners) beside the workflow worker; it starts each projector's workflow.

Run `python worker.py` (settings from the environment, see `configuration/settings.py`). Any number
of these processes can run against one cluster: the per-destination rates are enforced by the
Temporal server on the task queues, not by this process.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from datetime import timedelta
from typing import Any

import httpx
from durable_outbox_temporal import OutboxClient, connect
from durable_outbox_temporal.aggregates import AggregateClient
from durable_outbox_temporal.codec import codec_from_environment, data_converter
from durable_outbox_temporal.destinations import Destination, DestinationRegistry
from durable_outbox_temporal.tracing import configure_tracing
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from sqlalchemy import Engine
from temporalio.client import Client
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.worker import (
    Interceptor,
    PollerBehaviorAutoscaling,
    PollerBehaviorSimpleMaximum,
    UnsandboxedWorkflowRunner,
    Worker,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from activities.aggregate_store import AggregateStoreActivities
from activities.delivery import DeliveryActivities
from activities.flow import apply_flow_rate
from activities.flow_gate import FlowGate
from activities.projection import ProjectionActivities
from activities.projectors import ProjectorActivities
from activities.providers import build_provider, load_destinations
from activities.providers.base import HttpProviderSettings
from configuration.redaction import install_log_redaction
from configuration.settings import Settings, get_settings
from flowcontrol.breaker import BreakerGate, BreakerQueue
from flowcontrol.caps import FlowLimits
from flowcontrol.pacing import PacedQueue, RequestPacer, server_rate_reader
from flowcontrol.throttle import ThrottledQueue, ThrottleGate
from readmodel.db import create_schema, make_engine
from readmodel.flow_overrides import FlowPolicies
from readmodel.payload_store import claim_checks, prune_forever
from readmodel.writer import ProjectionWriter
from service.dead_letters import DeadLetterActivities
from service.debounce import DebounceActivities
from service.effects import EffectActivities
from service.flow_events import FlowEventActivities
from service.items import ItemService, PurgeActivities
from service.projectors import start_projectors
from service.relay import Relay
from service.schedules import ScheduleActivities
from workflows.aggregate import AggregateWorkflow
from workflows.bulk_shard import BulkShardWorkflow
from workflows.debounce import DebounceWindowWorkflow
from workflows.destination_flow import DestinationFlowWorkflow
from workflows.lane import OutboxLaneWorkflow
from workflows.outbox_item import OutboxItemWorkflow
from workflows.projector import ProjectorWorkflow
from workflows.purge_batch import PurgeBatchWorkflow
from workflows.redrive_batch import RedriveBatchWorkflow
from workflows.scheduled_batch import ScheduledBatchWorkflow

log = logging.getLogger("outbox.worker")

# Every workflow type the workflow worker hosts (the replay tests replay them all).
WORKFLOWS = [
    OutboxItemWorkflow,
    BulkShardWorkflow,
    OutboxLaneWorkflow,
    AggregateWorkflow,
    ScheduledBatchWorkflow,
    RedriveBatchWorkflow,
    PurgeBatchWorkflow,
    ProjectorWorkflow,
    DestinationFlowWorkflow,
    DebounceWindowWorkflow,
]


def default_operations_task_queue(workflow_task_queue: str) -> str:
    """The operations queue `build_workers` uses when given none: one per workflow queue, so
    stacks on distinct workflow queues (the tests') never share it. Deployments set
    `OPERATIONS_TASK_QUEUE` (`outbox-operations`) instead."""
    return f"{workflow_task_queue}-operations"


def build_workers(
    client: Client,
    *,
    destinations: Sequence[Destination],
    http_client: httpx.AsyncClient,
    engine: Engine | None,
    workflow_task_queue: str,
    run_workflows: bool = True,
    sandboxed: bool = False,
    operations_task_queue: str | None = None,
    registry: DestinationRegistry | None = None,
    interceptors: Sequence[Interceptor] = (),
    sticky_queue_timeout_s: float = 3.0,
    ledger_engine: Engine | None = None,
) -> list[Worker]:
    """All workers of one process; `engine` is the read model the projection writes to, and
    `sandboxed` runs workflows in Temporal's determinism sandbox (the tests do).

    `operations_task_queue` is the operations worker's queue (default: one of its own beside
    `workflow_task_queue`, see `default_operations_task_queue`); `registry` is every configured
    destination, which the operations activities enqueue to (default: `destinations`).
    `interceptors` go on every worker (the fault tests kill a process at a chosen point).
    `ledger_engine` is the database the caps and quotas count in, and the flow rules changed at
    run time are read from (default: `engine`; an activities-only process needs one for them).
    """
    workers: list[Worker] = []
    # One group-commit writer for every projection this process writes. Only a process that
    # runs workflows has the read model: an activities-only worker's submits and polls leave
    # their transitions to the workflow's local activity.
    writer = ProjectionWriter(engine) if engine is not None and run_workflows else None
    if run_workflows:
        if engine is None or writer is None:
            raise ValueError("the workflow worker needs the read-model engine for projections")
        projection = ProjectionActivities(engine, writer=writer)
        # A debounce window hands its carrier to the item's placement, with every destination.
        debounce = DebounceActivities(
            OutboxClient(
                client,
                registry or DestinationRegistry({d.name: d for d in destinations}),
                workflow_task_queue,
            ),
            writer,
        )
        workers.append(
            Worker(
                client,
                interceptors=interceptors,
                task_queue=workflow_task_queue,
                workflows=WORKFLOWS,
                activities=[
                    projection.project_item,
                    projection.project_items,
                    projection.project_lanes,
                    AggregateStoreActivities(engine).store_aggregate_events,
                    apply_flow_rate,
                    debounce.close_window,
                    debounce.cancel_member,
                ],
                # Projections are local activities. A debounce window's hand-over and a
                # member's cancel run here as regular activities, scheduled only once the
                # window's decision is recorded (`workflows/debounce.py` `_run`): rare, so two
                # pollers wait for them.
                activity_task_poller_behavior=PollerBehaviorSimpleMaximum(maximum=2),
                # Pollers scale with the work waiting (the SDK's default is 5 fixed), so more
                # tasks meet a waiting poller instead of the server's backlog.
                # Why: docs/decisions/autoscaling-pollers.md
                workflow_task_poller_behavior=PollerBehaviorAutoscaling(),
                sticky_queue_schedule_to_start_timeout=timedelta(seconds=sticky_queue_timeout_s),
                # The sandbox re-imports the workflow module for every run, the worker's largest
                # cost per item, so production runs without it. The test suite's workers run
                # sandboxed (`sandboxed=True`), so a non-deterministic call on any path a test
                # takes fails there; the replay tests over recorded histories catch changes that
                # alter a recorded history. Why: docs/decisions/unsandboxed-workflows.md
                workflow_runner=SandboxedWorkflowRunner()
                if sandboxed
                else UnsandboxedWorkflowRunner(),
            )
        )
        # The operations worker: activities the workflows above need that are not local ones
        # (the workflow queue polls for none). Enqueueing goes through `OutboxClient`, with
        # every destination configured, not only the ones this process delivers to.
        operations_client = OutboxClient(
            client,
            registry or DestinationRegistry({d.name: d for d in destinations}),
            workflow_task_queue,
        )
        operations_task_queue = operations_task_queue or default_operations_task_queue(
            workflow_task_queue
        )
        # Aggregates that effects create run their own effects here too.
        aggregate_client = AggregateClient(
            client, workflow_task_queue, operations_task_queue=operations_task_queue
        )
        workers.append(
            Worker(
                client,
                interceptors=interceptors,
                task_queue=operations_task_queue,
                activities=[
                    ScheduleActivities(operations_client).enqueue_batch,
                    DeadLetterActivities(ItemService(operations_client, engine)).redrive_page,
                    PurgeActivities(ItemService(operations_client, engine)).purge_page,
                    EffectActivities(operations_client, aggregate_client).execute_effect,
                    ProjectorActivities(engine).run_projector,
                    FlowEventActivities(operations_client).send_flow_event,
                ],
            )
        )
    ledger = ledger_engine or engine
    # Caps, quotas and breaker settings changed at run time (`readmodel.flow_overrides`).
    policies = (
        None if ledger is None else FlowPolicies(ledger, {d.name: d.flow for d in destinations})
    )
    delivery = DeliveryActivities(
        {
            destination.name: build_provider(destination, http_client)
            for destination in destinations
        },
        writer,
        RequestPacer(paced_queues(destinations), server_rate_reader(client)),
        ThrottleGate(throttled_queues(destinations)),
        flow_task_queue=workflow_task_queue,
        breaker=BreakerGate(
            breaker_queues(destinations), policies=None if policies is None else policies.current
        ),
        gate=FlowGate(ledger, flow_limits(destinations), policies=policies),
        attempt_log=ledger,
        events_task_queue=operations_task_queue
        or default_operations_task_queue(workflow_task_queue),
    )
    for destination in destinations:
        # The rate is per task queue and enforced by the server, across all worker processes.
        # A bulk destination's batched submits and polls count one activity per batch
        # (`submit_queue_rate`, `poll_queue_rate`).
        queues: list[tuple[str, list[Callable[..., Any]], float]] = [
            (
                destination.submit_task_queue,
                [delivery.submit_item, delivery.submit_items],
                destination.submit_queue_rate,
            ),
            (
                destination.poll_task_queue,
                # A circuit's probes run here: the poll queue stays open while it is.
                [delivery.poll_operation, delivery.poll_operations, delivery.probe_destination],
                destination.poll_queue_rate,
            ),
        ]
        for task_queue, activities, rate in queues:
            workers.append(
                Worker(
                    client,
                    interceptors=interceptors,
                    task_queue=task_queue,
                    activities=activities,
                    max_task_queue_activities_per_second=rate,
                    # As the workflow worker's pollers (above).
                    activity_task_poller_behavior=PollerBehaviorAutoscaling(),
                )
            )
    return workers


def paced_queues(destinations: Sequence[Destination]) -> dict[str, PacedQueue]:
    """The submit and poll queues of `destinations`, by task queue name."""
    queues = {}
    for destination in destinations:
        for queue in (
            PacedQueue(
                destination.submit_task_queue, destination.submit_rate, destination.submit_batch
            ),
            # With `poll_in_submit`, the poll queue's share of the poll rate (the first polls go
            # with the submits, paced as those).
            PacedQueue(
                destination.poll_task_queue,
                destination.poll_queue_rate * destination.poll_batch,
                destination.poll_batch,
            ),
        ):
            queues[queue.task_queue] = queue
    return queues


def throttled_queues(destinations: Sequence[Destination]) -> dict[str, ThrottledQueue]:
    """Each destination's submit queue as its throttle rule sees it (`flowcontrol.throttle`)."""
    return {
        d.name: ThrottledQueue.of(d.name, d.submit_task_queue, d.submit_queue_rate, d.flow)
        for d in destinations
    }


def flow_limits(destinations: Sequence[Destination]) -> dict[str, FlowLimits]:
    """Each destination's caps and quotas (`flowcontrol/caps.py`)."""
    default_request_s = HttpProviderSettings.model_fields["timeout_s"].default
    return {
        d.name: FlowLimits.of(
            d.name,
            d.flow,
            max(d.delivery.submit_timeout_s, d.delivery.poll_timeout_s),
            float(d.settings.get("timeout_s", default_request_s)),
        )
        for d in destinations
    }


def breaker_queues(destinations: Sequence[Destination]) -> dict[str, BreakerQueue]:
    """Each destination's submit queue as its circuit breaker sees it (`flowcontrol.breaker`)."""
    return {
        d.name: BreakerQueue.of(
            d.name, d.submit_task_queue, d.poll_task_queue, d.submit_queue_rate, d.flow
        )
        for d in destinations
    }


def worker_runtime(metrics_address: str | None) -> Runtime | None:
    """The SDK runtime exporting Temporal's worker metrics (task latencies, slots, polls) for
    Prometheus at `metrics_address` `/metrics`; None: the default runtime, no export."""
    if not metrics_address:
        return None
    metrics = PrometheusConfig(bind_address=metrics_address)
    return Runtime(telemetry=TelemetryConfig(metrics=metrics))


async def run_worker(
    settings: Settings,
    only_destinations: list[str] | None,
    run_workflows: bool,
    interceptors: Sequence[Interceptor] = (),
) -> None:
    """Run until SIGINT/SIGTERM, then finish in-flight tasks and stop."""
    registry = load_destinations(settings.outbox_config)
    destinations = list(registry)
    if only_destinations is not None:
        unknown = sorted(set(only_destinations) - set(registry.names))
        if unknown:
            raise SystemExit(f"unknown destinations: {', '.join(unknown)}")
        destinations = [d for d in destinations if d.name in only_destinations]
    engine = None
    if run_workflows:
        engine = make_engine(settings.database_url)
        create_schema(engine)
    runtime = worker_runtime(settings.worker_metrics_address)
    tracing = configure_tracing("durable-outbox-worker")
    # Claim checks read and write the database every process shares (DATABASE_URL): an
    # activities-only worker needs it too, to read a large payload its submit carries.
    storage_engine = engine
    if storage_engine is None and settings.claim_check_bytes > 0:
        storage_engine = make_engine(settings.database_url)
    # Caps and quotas count in that database too (`flowcontrol/caps.py`), and the flow rules
    # changed at run time are read from it (`readmodel.flow_overrides`).
    ledger_engine = engine or storage_engine or make_engine(settings.database_url)
    converter = data_converter(
        codec_from_environment(), claim_checks(storage_engine, settings.claim_check_bytes)
    )
    client = await connect(runtime=runtime, data_converter=converter)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with AsyncExitStack() as stack:
        connections = settings.provider_max_connections
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        http_client = await stack.enter_async_context(httpx.AsyncClient(limits=limits))
        if tracing:
            # Provider requests as spans under their activity, with `traceparent` sent on.
            HTTPXClientInstrumentor.instrument_client(http_client)
        workers = build_workers(
            client,
            destinations=destinations,
            http_client=http_client,
            engine=engine,
            ledger_engine=ledger_engine,
            workflow_task_queue=settings.workflow_task_queue,
            run_workflows=run_workflows,
            operations_task_queue=settings.operations_task_queue,
            registry=registry,
            interceptors=interceptors,
            sticky_queue_timeout_s=settings.sticky_queue_timeout_s,
        )
        for worker in workers:
            await stack.enter_async_context(worker)
        if run_workflows and settings.relay_enabled and engine is not None:
            # The transactional outbox's relay runs beside the workers (several processes'
            # relays share the rows safely on PostgreSQL).
            relay = Relay(
                OutboxClient(client, registry, settings.workflow_task_queue),
                engine,
                poll_interval_s=settings.relay_poll_interval_s,
                retention=timedelta(seconds=settings.relay_retention_s),
                max_attempts=settings.relay_max_attempts,
            )
            relay_task = asyncio.create_task(relay.run())
            stack.callback(relay_task.cancel)
        if run_workflows and engine is not None and settings.claim_check_bytes > 0:
            # Claim-check blobs whose workflow Temporal no longer has are removed hourly.
            pruner = asyncio.create_task(prune_forever(engine, client))
            stack.callback(pruner.cancel)
        if run_workflows:
            # Every workflow worker makes sure each async projector has its one runner.
            await start_projectors(
                client, settings.workflow_task_queue, settings.operations_task_queue
            )
        log.info(
            "worker ready: %s; destinations: %s",
            "workflows + activities" if run_workflows else "activities only",
            ", ".join(
                f"{d.name} (submit {d.submit_rate}/s, poll {d.poll_rate}/s)" for d in destinations
            )
            or "none",
        )
        await stop.wait()
        log.info("shutting down: finishing in-flight tasks")
    if storage_engine is not None:
        storage_engine.dispose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-workflows", action="store_true", help="run activity workers only")
    parser.add_argument(
        "--destinations", help="comma-separated destinations to serve (default: all configured)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # One line per provider request at INFO would drown the worker's own log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # A provider's error may quote its URL, and a receiver's URL may carry a token.
    install_log_redaction()
    only = args.destinations.split(",") if args.destinations else None
    asyncio.run(run_worker(get_settings(), only, run_workflows=not args.no_workflows))


if __name__ == "__main__":
    main()
