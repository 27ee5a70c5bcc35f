"""Prometheus metrics: HTTP requests by route template, enqueues by outcome, the backlog, and
the destinations' state (paused, throttled, circuit, rate in force)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.backlog_metrics import BacklogMetrics
from api.destination_metrics import DestinationMetrics


class ApiMetrics:
    """One registry per app, so several apps (tests) never collide on metric names."""

    def __init__(self, *, backlog_cache_s: float = 5.0, backlog_timeout_s: float = 5.0) -> None:
        self.registry = CollectorRegistry()
        # Read from the read model at scrape time (`refresh`), once the app has its engine.
        self.backlog = BacklogMetrics(
            self.registry, cache_s=backlog_cache_s, timeout_s=backlog_timeout_s
        )
        # Read from Temporal at scrape time, once the app has its destination controls.
        self.destinations = DestinationMetrics(
            self.registry, cache_s=backlog_cache_s, timeout_s=backlog_timeout_s
        )
        self.requests = Counter(
            "outbox_http_requests_total",
            "HTTP requests by method, route template and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "outbox_http_request_duration_seconds",
            "HTTP request latency by method and route template.",
            ["method", "route"],
            registry=self.registry,
            buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        self.enqueued = Counter(
            "outbox_items_enqueued_total",
            "Enqueued items by outbox, destination and result"
            " (created, existing, rejected, error).",
            ["outbox", "destination", "result"],
            registry=self.registry,
        )

        self.reports = Counter(
            "outbox_delivery_reports_total",
            "Provider delivery reports by destination and result (applied, unknown: no item"
            " has the message id, late: the item stopped listening, ignored: another event"
            " type, invalid: unreadable).",
            ["destination", "result"],
            registry=self.registry,
        )

    def count_reports(self, destination: str, result: str, count: int) -> None:
        """Count a delivery's reports; the destination is a configured one (bounded labels)."""
        if count:
            self.reports.labels(destination, result).inc(count)

    def count_enqueue(self, outbox: str, destination: str, result: str) -> None:
        """Count one enqueue; callers pass only validated names, so label values stay bounded."""
        self.enqueued.labels(outbox, destination, result).inc()


class MetricsMiddleware:
    """Times every HTTP request and labels it with its route template, not the raw path."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def capture(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            route = _route_template(scope)
            self.metrics.requests.labels(scope["method"], route, str(status)).inc()
            self.metrics.latency.labels(scope["method"], route).observe(
                time.perf_counter() - started
            )


def _route_template(scope: Scope) -> str:
    # The router records the matched route in the (shared) scope; unmatched paths stay grouped
    # under one label so random URLs cannot blow up the metric's cardinality.
    route = scope.get("route")
    return str(getattr(route, "path", "unmatched"))
