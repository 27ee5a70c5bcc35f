"""One in-process product stack for the benchmarks that need a dev server of their own: an
in-memory dev server, the fake provider, a read model, one webhook destination, the workers and
an `OutboxClient`, all closed with the caller's `AsyncExitStack`."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from durable_outbox_temporal import OutboxClient
from durable_outbox_temporal.codec import data_converter
from durable_outbox_temporal.destinations import Destination, DestinationRegistry
from sqlalchemy import Engine
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Interceptor

from devstack.fake_provider import FakeProvider, FaultConfig, run_fake_provider
from devstack.temporal_server import dev_server_extra_args, temporal_cli_path
from readmodel.db import create_schema, make_engine
from readmodel.payload_store import claim_checks
from readmodel.routes import ReadModelRoutes
from worker import build_workers


@dataclass
class BenchStack:
    env: WorkflowEnvironment
    fake: FakeProvider
    engine: Engine
    destination: Destination
    outbox: OutboxClient


async def webhook_stack(
    exits: AsyncExitStack,
    *,
    name: str,
    db_file: Path,
    workflow_task_queue: str,
    faults: FaultConfig | None = None,
    fairness: bool = True,
    interceptors: Sequence[Interceptor] = (),
    claim_check_bytes: int = 0,
    suggest_continue_as_new_events: int | None = None,
    **destination_fields: Any,
) -> BenchStack:
    """Start it all; `db_file` is the read model (recreated), `destination_fields` the webhook
    destination's settings beyond its name and URL (rates, backoff...). `claim_check_bytes`:
    payloads above it stored in the read model, as `worker.py` does by default (0: inline).
    `suggest_continue_as_new_events`: the server suggests continuing as new past this many history
    events (the dev server's default when None), for a scenario about hand-overs."""
    engine = _fresh_read_model(db_file)
    exits.callback(engine.dispose)
    env = await exits.enter_async_context(
        await WorkflowEnvironment.start_local(
            # The product's payload converter, as `worker.py` and the API use it.
            data_converter=data_converter(None, claim_checks(engine, claim_check_bytes)),
            dev_server_existing_path=temporal_cli_path(),
            dev_server_extra_args=[
                *dev_server_extra_args(None, fairness=fairness),
                "--log-level",
                "error",
                *(
                    []
                    if suggest_continue_as_new_events is None
                    else [
                        "--dynamic-config-value",
                        f"limit.historyCount.suggestContinueAsNew={suggest_continue_as_new_events}",
                    ]
                ),
            ],
        )
    )
    fake = await exits.enter_async_context(run_fake_provider(faults))
    destination = Destination.model_validate(
        {
            "name": name,
            "provider": "webhook",
            "settings": {"url": f"{fake.url}/webhook/{name}", "secret": fake.state.webhook_secret},
            **destination_fields,
        }
    )
    http = await exits.enter_async_context(httpx.AsyncClient())
    for worker in build_workers(
        env.client,
        destinations=[destination],
        http_client=http,
        engine=engine,
        workflow_task_queue=workflow_task_queue,
        interceptors=interceptors,
    ):
        await exits.enter_async_context(worker)
    # As the API hands over: a bulk owner's route is claimed in the read model first.
    outbox = OutboxClient(
        env.client,
        DestinationRegistry({destination.name: destination}),
        workflow_task_queue,
        routes=ReadModelRoutes(engine),
    )
    return BenchStack(env, fake, engine, destination, outbox)


def _fresh_read_model(db_file: Path) -> Engine:
    db_file.parent.mkdir(parents=True, exist_ok=True)
    db_file.unlink(missing_ok=True)
    engine = make_engine(f"sqlite:///{db_file}")
    create_schema(engine)
    return engine
