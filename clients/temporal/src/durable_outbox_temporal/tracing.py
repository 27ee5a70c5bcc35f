"""OpenTelemetry tracing across the whole path: the API's request, the Temporal client's start,
the workflow and its activities (the SDK's `TracingInterceptor`), and the provider request
(httpx, which sends the `traceparent` header on).

Configured by the standard `OTEL_*` variables and off when none asks for it: an exporter
endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, OTLP over HTTP)
or `OTEL_TRACES_EXPORTER` (`otlp` or `console`; `none` turns it off). `OTEL_SERVICE_NAME`
overrides each process's name; the other standard variables (headers, sampling, resource
attributes) are the OpenTelemetry SDK's own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

_configured = False


def tracing_requested(environ: Mapping[str, str] | None = None) -> bool:
    variables = os.environ if environ is None else environ
    exporter = variables.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return bool(
        exporter
        or variables.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or variables.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def configure_tracing(service_name: str) -> bool:
    """Install this process's tracer provider and exporter if `OTEL_*` asks for tracing; whether
    tracing is on. Once per process: later calls only answer."""
    global _configured
    if _configured:
        return True
    if not tracing_requested():
        return False
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SpanExporter,
    )

    exporter: SpanExporter
    if os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "console":
        exporter = ConsoleSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _configured = True
    return True


def temporal_interceptors() -> list[Any]:
    """The Temporal client's (and so its workers') tracing interceptor, when tracing is on."""
    if not tracing_requested():
        return []
    from temporalio.contrib.opentelemetry import TracingInterceptor

    return [TracingInterceptor()]
