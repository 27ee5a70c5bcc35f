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
from collections.abc import Callable, Coroutine, Sequence
from contextlib import AsyncExitStack
from datetime import timedelta
from typing import Any, ClassVar

import httpx
from durable_outbox_temporal import OutboxClient
from durable_outbox_temporal.aggregates import AggregateClient
from durable_outbox_temporal.codec import codec_from_environment
from durable_outbox_temporal.destinations import Destination, DestinationRegistry
from durable_outbox_temporal.tracing import configure_tracing
from sqlalchemy import Engine
from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import (
    Interceptor,
    PollerBehaviorAutoscaling,
    PollerBehaviorSimpleMaximum,
    UnsandboxedWorkflowRunner,
    Worker,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from activities.aggregate_store import AggregateStoreActivities
from activities.debounce import DebounceActivities
from activities.delivery import HEARTBEAT_THROTTLE, DeliveryActivities
from activities.delivery_projection import LeftToWorkflow, ProjectedHere, TransitionProjection
from activities.effects import EffectActivities
from activities.erasure import EraseActivities
from activities.flow import apply_flow_rate
from activities.flow_events import FlowEventActivities
from activities.projection import ProjectionActivities
from activities.projectors import ProjectorActivities
from activities.providers import build_provider
from activities.purge import PurgeActivities
from activities.redrive import RedriveActivities
from activities.replay import ReplayActivities
from activities.reseal import ResealActivities
from activities.retention import RetentionActivities, ensure_retention_schedule
from activities.schedules import ScheduleActivities
from activities.worker_startup import (
    WorkerDatabases,
    connect_worker,
    open_provider_client,
    open_read_model,
    refuse_a_changed_shard_count,
    refuse_an_open_production,
    refuse_bulk_without_claim_checks,
    served_destinations,
    worker_runtime,
)
from configuration.destinations import load_destinations
from configuration.gc_pauses import freeze_startup_heap
from configuration.providers import HttpProviderSettings
from configuration.redaction import install_log_redaction
from configuration.settings import Settings, get_settings
from flowcontrol.guard import FlowGuard
from readmodel import attempts
from readmodel.payload_store import prune_forever
from readmodel.routes import ReadModelRoutes
from readmodel.writer import ProjectionWriter
from service.aggregate_types import AggregateTypeError, AggregateTypes, load_aggregate_types
from service.items import ItemService
from service.projectors import start_projectors
from service.relay import Relay
from workflows.aggregate import AggregateWorkflow
from workflows.aggregate_types import host
from workflows.bulk_shard import BulkShardWorkflow
from workflows.debounce import DebounceWindowWorkflow
from workflows.destination_flow import DestinationFlowWorkflow
from workflows.erase_batch import EraseBatchWorkflow
from workflows.lane import OutboxLaneWorkflow
from workflows.outbox_item import OutboxItemWorkflow
from workflows.projector import ProjectorWorkflow
from workflows.purge_batch import PurgeBatchWorkflow
from workflows.redrive_batch import RedriveBatchWorkflow
from workflows.replay_batch import ReplayBatchWorkflow
from workflows.reseal_batch import ResealBatchWorkflow
from workflows.retention import RetentionWorkflow
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
    ResealBatchWorkflow,
    RetentionWorkflow,
    EraseBatchWorkflow,
    ReplayBatchWorkflow,
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
    aggregate_types: AggregateTypes | None = None,
    shutdown_grace_s: float = 0.0,
) -> list[Worker]:
    """All workers of one process; `engine` is the read model the projection writes to, and
    `sandboxed` runs workflows in Temporal's determinism sandbox (the tests do).

    `operations_task_queue` is the operations worker's queue (default: one of its own beside
    `workflow_task_queue`, see `default_operations_task_queue`); `registry` is every configured
    destination, which the operations activities enqueue to (default: `destinations`).
    `interceptors` go on every worker (the fault tests kill a process at a chosen point).
    `ledger_engine` is the database the caps and quotas count in, and the flow rules changed at
    run time are read from (default: `engine`; an activities-only process needs one for them).
    `aggregate_types` are the aggregate types the workflows host, with their projectors
    (default: those `AGGREGATE_TYPES` configures). `shutdown_grace_s` is how long activities in
    flight at shutdown get to finish before they are cancelled (`WORKER_SHUTDOWN_GRACE_S`).
    """
    grace = timedelta(seconds=shutdown_grace_s)
    operations_task_queue = operations_task_queue or default_operations_task_queue(
        workflow_task_queue
    )
    # Enqueueing from the worker goes through `OutboxClient`, with every destination
    # configured, not only the ones this process delivers to.
    outbox = OutboxClient(
        client,
        registry or DestinationRegistry({d.name: d for d in destinations}),
        workflow_task_queue,
        # Bulk owners' routes where this process has the read model (decisions/shard-routes.md).
        routes=None if engine is None else ReadModelRoutes(engine),
    )
    # Only a process that runs workflows has the read model: an activities-only worker's
    # submits and polls leave their transitions to the workflow's local activity.
    projection: TransitionProjection = LeftToWorkflow()
    workers: list[Worker] = []
    if run_workflows:
        if engine is None:
            raise ValueError("the workflow worker needs the read-model engine for projections")
        # One group-commit writer for every projection this process writes.
        writer = ProjectionWriter(engine)
        projection = ProjectedHere(writer)
        types = aggregate_types or load_aggregate_types(get_settings().aggregate_types)
        host(types.definitions)
        workers += [
            workflow_worker(
                client,
                outbox,
                engine,
                writer,
                task_queue=workflow_task_queue,
                sandboxed=sandboxed,
                sticky_queue_timeout_s=sticky_queue_timeout_s,
                interceptors=interceptors,
                shutdown_grace=grace,
            ),
            operations_worker(
                client,
                outbox,
                engine,
                types,
                task_queue=operations_task_queue,
                interceptors=interceptors,
                shutdown_grace=grace,
            ),
        ]
    # The one flow guard every submit and poll of this process goes through.
    guard = FlowGuard.for_destinations(
        destinations,
        client,
        ledger=ledger_engine or engine,
        default_request_s=HttpProviderSettings.model_fields["timeout_s"].default,
        flow_task_queue=workflow_task_queue,
        events_task_queue=operations_task_queue,
    )
    providers = {d.name: build_provider(d, http_client) for d in destinations}
    delivery = DeliveryActivities(providers, guard, projection)
    workers += delivery_workers(
        client, delivery, destinations, interceptors=interceptors, shutdown_grace=grace
    )
    return workers


def workflow_worker(
    client: Client,
    outbox: OutboxClient,
    engine: Engine,
    writer: ProjectionWriter,
    *,
    task_queue: str,
    sandboxed: bool,
    sticky_queue_timeout_s: float,
    interceptors: Sequence[Interceptor],
    shutdown_grace: timedelta = timedelta(),
) -> Worker:
    """The worker of every workflow type, with the local activities they run (projections, the
    event store, queue rates) and a debounce window's hand-over."""
    projection = ProjectionActivities(engine, writer=writer)
    # A debounce window hands its carrier to the item's placement, with every destination.
    debounce = DebounceActivities(outbox, writer)
    aggregate_store = AggregateStoreActivities(engine)
    return Worker(
        client,
        interceptors=interceptors,
        task_queue=task_queue,
        graceful_shutdown_timeout=shutdown_grace,
        workflows=WORKFLOWS,
        activities=[
            projection.project_item,
            projection.project_items,
            projection.project_lanes,
            projection.record_late_reports,
            aggregate_store.store_aggregate_events,
            aggregate_store.passivate_aggregate,
            aggregate_store.resume_aggregate,
            aggregate_store.read_aggregate_events,
            apply_flow_rate,
            debounce.close_window,
            debounce.cancel_member,
        ],
        # Projections are local activities. A debounce window's hand-over and a member's cancel
        # run here as regular activities, scheduled only once the window's decision is recorded
        # (`workflows/debounce.py` `_run`): rare, so two pollers wait for them.
        activity_task_poller_behavior=PollerBehaviorSimpleMaximum(maximum=2),
        # Pollers scale with the work waiting (the SDK's default is 5 fixed), so more tasks meet
        # a waiting poller instead of the server's backlog.
        # Why: docs/decisions/autoscaling-pollers.md
        workflow_task_poller_behavior=PollerBehaviorAutoscaling(),
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=sticky_queue_timeout_s),
        # The sandbox re-imports the workflow module for every run, the worker's largest cost per
        # item, so production runs without it. The test suite's workers run sandboxed
        # (`sandboxed=True`), so a non-deterministic call on any path a test takes fails there;
        # the replay tests over recorded histories catch changes that alter a recorded history.
        # Why: docs/decisions/unsandboxed-workflows.md
        workflow_runner=SandboxCheckingOnce() if sandboxed else UnsandboxedWorkflowRunner(),
    )


class SandboxCheckingOnce(SandboxedWorkflowRunner):
    """Temporal's determinism sandbox, checking each workflow definition once per process.

    A worker checks every workflow it registers by building it in the sandbox, which imports the
    workflow modules afresh. The test suite builds about a thousand sandboxed workers and paid
    that check for each of their workflows every time: 55 s of the suite's CPU (py-spy,
    2026-11-28). A definition's check cannot come out otherwise later in the same process. Every
    run is sandboxed as before."""

    _checked: ClassVar[set[type]] = set()

    def prepare_workflow(self, defn: workflow._Definition) -> None:
        if defn.cls in self._checked:
            return
        super().prepare_workflow(defn)
        self._checked.add(defn.cls)


def operations_worker(
    client: Client,
    outbox: OutboxClient,
    engine: Engine,
    types: AggregateTypes,
    *,
    task_queue: str,
    interceptors: Sequence[Interceptor],
    shutdown_grace: timedelta = timedelta(),
) -> Worker:
    """The activities the workflows need that are not local ones (the workflow queue polls for
    none): a schedule's fire, redrive, purge, erase, reseal, retention and replay pages,
    effects, projector runs, flow events."""
    # Aggregates that effects create run their own effects here too.
    aggregate_client = AggregateClient(
        client,
        outbox.task_queue,
        definitions=types.definitions,
        operations_task_queue=task_queue,
    )
    return Worker(
        client,
        interceptors=interceptors,
        task_queue=task_queue,
        graceful_shutdown_timeout=shutdown_grace,
        activities=[
            ScheduleActivities(outbox).enqueue_batch,
            RedriveActivities(ItemService(outbox, engine).redrive, engine).redrive_page,
            PurgeActivities(outbox, engine).purge_page,
            ResealActivities(engine, types.sealed_tables).reseal_page,
            *_retention_activities(engine, outbox.destinations),
            EraseActivities(engine, outbox.destinations).erase_page,
            ReplayActivities(ItemService(outbox, engine).enqueue_many, engine).replay_page,
            EffectActivities(outbox, aggregate_client).execute_effect,
            ProjectorActivities(engine, types.projectors).run_projector,
            FlowEventActivities(outbox).send_flow_event,
        ],
    )


def _retention_activities(engine: Engine, registry: DestinationRegistry) -> list[Any]:
    retention = RetentionActivities(engine, registry)
    return [retention.retention_plan, retention.prune_page, retention.prune_lanes_page]


def delivery_workers(
    client: Client,
    delivery: DeliveryActivities,
    destinations: Sequence[Destination],
    *,
    interceptors: Sequence[Interceptor],
    shutdown_grace: timedelta = timedelta(),
) -> list[Worker]:
    """One submit and one poll worker per destination, each at its queue's rate: the rate is
    per task queue and enforced by the server, across all worker processes. A bulk
    destination's batched submits and polls count one activity per batch (`submit_queue_rate`,
    `poll_queue_rate`)."""
    workers = []
    for destination in destinations:
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
                    graceful_shutdown_timeout=shutdown_grace,
                    activities=activities,
                    max_task_queue_activities_per_second=rate,
                    # As the workflow worker's pollers.
                    activity_task_poller_behavior=PollerBehaviorAutoscaling(),
                    # A long request's heartbeats go as they come, a third of the heartbeat
                    # timeout apart (`activities.delivery._to_the_end`).
                    max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
                )
            )
    return workers


async def run_worker(
    settings: Settings,
    only_destinations: list[str] | None,
    run_workflows: bool,
    interceptors: Sequence[Interceptor] = (),
) -> None:
    """Run until SIGINT/SIGTERM, then finish in-flight tasks and stop."""
    registry = load_destinations(settings.outbox_config)
    try:
        aggregate_types = load_aggregate_types(settings.aggregate_types)
    except AggregateTypeError as err:
        raise SystemExit(str(err)) from err
    destinations = served_destinations(registry, only_destinations)
    codec = codec_from_environment()
    refuse_an_open_production(settings, codec, destinations)
    if run_workflows:
        refuse_bulk_without_claim_checks(settings, registry)
    migrations = aggregate_types.migrations
    read_model = open_read_model(settings, migrations) if run_workflows else None
    runtime = worker_runtime(settings.worker_metrics_address)
    tracing = configure_tracing("durable-outbox-worker")
    databases = WorkerDatabases.open(settings, read_model, migrations, codec)
    client = await connect_worker(settings, runtime, codec, databases.storage)
    if run_workflows:
        assert read_model is not None
        await refuse_a_changed_shard_count(client, registry, read_model)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with AsyncExitStack() as stack:
        workers = build_workers(
            client,
            destinations=destinations,
            http_client=await open_provider_client(stack, settings, tracing),
            engine=read_model,
            ledger_engine=databases.ledger,
            workflow_task_queue=settings.workflow_task_queue,
            run_workflows=run_workflows,
            operations_task_queue=settings.operations_task_queue,
            registry=registry,
            interceptors=interceptors,
            sticky_queue_timeout_s=settings.sticky_queue_timeout_s,
            aggregate_types=aggregate_types,
            shutdown_grace_s=settings.worker_shutdown_grace_s,
        )
        for worker in workers:
            await stack.enter_async_context(worker)
        if read_model is not None:
            await start_beside_workflows(
                stack, client, settings, registry, read_model, aggregate_types
            )
        freeze_startup_heap()
        log.info(
            "worker ready: %s; destinations: %s",
            "workflows + activities" if run_workflows else "activities only",
            ", ".join(
                f"{d.name} (submit {d.submit_rate}/s, poll {d.poll_rate}/s)" for d in destinations
            )
            or "none",
        )
        await stop.wait()
        log.info(
            "shutting down: in-flight activities get %ss to finish (WORKER_SHUTDOWN_GRACE_S)",
            settings.worker_shutdown_grace_s,
        )
        # All at once, so the whole process drains within one grace, not one per worker.
        await asyncio.gather(*(worker.shutdown() for worker in workers))
        await attempts.flush_all()
    if databases.storage is not None:
        databases.storage.dispose()


async def start_beside_workflows(
    stack: AsyncExitStack,
    client: Client,
    settings: Settings,
    registry: DestinationRegistry,
    read_model: Engine,
    aggregate_types: AggregateTypes,
) -> None:
    """What every worker that runs workflows starts beside its workers: the transactional
    outbox's relay and the claim-check pruner, until `stack` closes, and (as configured) the
    retention schedule and each async projector's runner."""
    if settings.relay_enabled:
        # Several processes' relays share the rows safely on PostgreSQL.
        relay = Relay(
            OutboxClient(
                client, registry, settings.workflow_task_queue, routes=ReadModelRoutes(read_model)
            ),
            read_model,
            poll_interval_s=settings.relay_poll_interval_s,
            retention=timedelta(seconds=settings.relay_retention_s),
            max_attempts=settings.relay_max_attempts,
        )
        _run_beside(stack, relay.run())
    if settings.claim_check_bytes > 0:
        # Claim-check blobs whose workflow Temporal no longer has are removed hourly.
        _run_beside(stack, prune_forever(read_model, client))
    await ensure_retention_schedule(
        client,
        settings.workflow_task_queue,
        settings.operations_task_queue,
        timedelta(seconds=settings.retention_interval_s),
    )
    await start_projectors(
        client,
        settings.workflow_task_queue,
        settings.operations_task_queue,
        aggregate_types.projectors,
    )


def _run_beside(stack: AsyncExitStack, service: Coroutine[Any, Any, None]) -> None:
    """Run `service` as a task of its own, cancelled when `stack` closes."""
    task = asyncio.create_task(service)
    stack.callback(task.cancel)


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
