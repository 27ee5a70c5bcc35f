"""The naive baseline: one workflow per item, two plain activities, as Temporal's samples would
write it — no projection, no search attributes, no per-destination rate-limit queues."""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    import httpx
    from durable_outbox_temporal.contract.item import (
        OperationStatus,
        PollRequest,
        PollResult,
        SubmitRequest,
        SubmitResult,
    )

    from activities.providers.acs_email import AcsEmailProvider
    from configuration.providers import AcsEmailSettings

TASK_QUEUE = "naive"
ACCESS_KEY = "ZmFrZS1hY3MtYWNjZXNzLWtleQ=="
# The job's email: the send body every measured path (the product, this baseline, DBOS, the
# relay) submits.
EMAIL = {
    "senderAddress": "bench@example.com",
    "recipients": {"to": [{"address": "load@example.com"}]},
    "content": {"subject": "bench", "plainText": "bench"},
}


class NaiveActivities:
    def __init__(self, provider: AcsEmailProvider) -> None:
        self.provider = provider

    @activity.defn
    async def naive_submit(self, request: SubmitRequest) -> SubmitResult:
        return await self.provider.submit(request)

    @activity.defn
    async def naive_poll(self, request: PollRequest) -> PollResult:
        return await self.provider.poll(request)


@workflow.defn
class NaiveItemWorkflow:
    @workflow.run
    async def run(self, request: SubmitRequest) -> str:
        accepted: SubmitResult = await workflow.execute_activity(
            "naive_submit",
            request,
            result_type=SubmitResult,
            start_to_close_timeout=timedelta(seconds=30),
        )
        while True:
            await workflow.sleep(0.05)
            result: PollResult = await workflow.execute_activity(
                "naive_poll",
                PollRequest(request.destination, request.item_id, accepted.operation_url or ""),
                result_type=PollResult,
                start_to_close_timeout=timedelta(seconds=30),
            )
            if result.status is OperationStatus.SUCCEEDED:
                return "sent"


async def run_worker() -> None:
    # Register the class from the importable module, not `__main__`: the workflow sandbox
    # re-imports a workflow's module by name.
    from bench.naive import NaiveItemWorkflow as workflow_class

    client = await Client.connect(os.environ["TEMPORAL_ADDRESS"])
    async with httpx.AsyncClient() as http:
        settings = AcsEmailSettings(endpoint=os.environ["FAKE_PROVIDER_URL"], access_key=ACCESS_KEY)
        provider = AcsEmailProvider(settings, http)
        naive = NaiveActivities(provider)
        worker = Worker(
            client,
            task_queue=TASK_QUEUE,
            workflows=[workflow_class],
            activities=[naive.naive_submit, naive.naive_poll],
        )
        print("naive worker ready", flush=True)
        await worker.run()


if __name__ == "__main__" and sys.argv[1:] == ["worker"]:
    asyncio.run(run_worker())
