"""Tracing: one trace runs from the HTTP enqueue through the workflow and its activity to the
provider request; and with no OTEL_* variable nothing is traced."""

from __future__ import annotations

from typing import Any

import httpx
from durable_outbox_temporal.tracing import temporal_interceptors, tracing_requested
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client
from temporalio.contrib.opentelemetry import TracingInterceptor

from api.main import create_app
from tests.api.conftest import api_settings
from tests.conftest import webhook_destination


def chain(span: ReadableSpan, by_id: dict[int, ReadableSpan]) -> list[str]:
    """The span's name and its ancestors' names, nearest first."""
    names = [span.name]
    while span.parent is not None and span.parent.span_id in by_id:
        span = by_id[span.parent.span_id]
        names.append(span.name)
    return names


async def test_one_trace_runs_from_the_enqueue_request_to_the_provider(
    time_skipping_env: Any, stack_factory: Any, fake_provider: Any
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    interceptor = TracingInterceptor(provider.get_tracer("durable-outbox"))
    client = Client(**{**time_skipping_env.client.config(), "interceptors": [interceptor]})
    HTTPXClientInstrumentor().instrument(tracer_provider=provider)
    try:
        destination = webhook_destination(fake_provider)
        stack = await stack_factory(destination, client=client)
        settings = api_settings(workflow_task_queue=stack.task_queue)
        app = create_app(settings, outbox_client=stack.outbox, engine=stack.engine)
        FastAPIInstrumentor.instrument_app(app, tracer_provider=provider)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
                response = await http.post(
                    "/v1/outboxes/tests/items",
                    json={"destination": destination.name, "payload": {"order": 7}},
                    headers={"Idempotency-Key": "traced"},
                )
                assert response.status_code == 202, response.text
                await stack.result(response.json()["id"])
    finally:
        HTTPXClientInstrumentor().uninstrument()

    spans = list(exporter.get_finished_spans())
    by_id = {span.context.span_id: span for span in spans}
    delivered = [
        span
        for span in spans
        if span.attributes
        and f"/webhook/{destination.name}"
        in str(span.attributes.get("url.full", span.attributes.get("http.url", "")))
    ]
    assert delivered, [span.name for span in spans]
    ancestry = chain(delivered[0], by_id)
    # The provider request, inside the submit activity the workflow scheduled, inside the start
    # the API made in the HTTP request that enqueued it: one trace.
    assert ancestry[1:] == [
        "RunActivity:submit_item",
        "StartActivity:submit_item",
        "StartWorkflow:OutboxItem",
        "POST /v1/outboxes/{outbox}/items",
    ], ancestry
    trace_id = delivered[0].context.trace_id
    in_trace = {span.name for span in spans if span.context.trace_id == trace_id}
    assert "RunWorkflow:OutboxItem" in in_trace, in_trace
    # The provider saw the trace too: the httpx span's context went out as `traceparent`
    # (version-traceid-spanid-flags), so its own logs join the same trace.
    [arrived] = await fake_provider.admin.deliveries(destination.name)
    version, sent_trace, sent_span, _flags = arrived["traceparent"].split("-")
    assert (version, sent_trace, sent_span) == (
        "00",
        f"{trace_id:032x}",
        f"{delivered[0].context.span_id:016x}",
    ), arrived


def test_tracing_is_off_unless_otel_variables_ask_for_it() -> None:
    assert not tracing_requested({})
    assert not tracing_requested(
        {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "x"}
    )
    assert tracing_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert tracing_requested({"OTEL_TRACES_EXPORTER": "console"})
    assert temporal_interceptors() == []  # the test process sets none
