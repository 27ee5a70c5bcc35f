"""Prometheus metrics: HTTP requests by route template, enqueues by outcome, the backlog, and
the destinations' state (paused, throttled, circuit, rate in force).

Every label value is bounded by what operators configured, never by what a caller invents: the
`outbox` label names the outboxes in `METRICS_OUTBOXES` and at most `METRICS_OUTBOX_LABELS` of the
most active others, the rest count as `other` (`api/outbox_labels.py`). With tokens configured
`/metrics` needs a bearer token with the `metrics` scope, unless `METRICS_TOKEN_REQUIRED=false`
(`require_metrics_token`).
"""

from __future__ import annotations

import time

from fastapi import Request
from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api import auth
from api.backlog_metrics import BacklogMetrics
from api.destination_metrics import DestinationMetrics
from api.errors import ApiProblem
from api.outbox_labels import OutboxLabels

# The `outbox` label of refused enqueues naming an outbox nobody has used: names a caller
# invents all count here instead of each adding series.
UNKNOWN_OUTBOX = "(unknown)"
# What the items routes already count invalid outbox names under.
_INVALID_OUTBOX = "invalid"


class ApiMetrics:
    """One registry per app, so several apps (tests) never collide on metric names."""

    def __init__(
        self,
        *,
        backlog_cache_s: float = 5.0,
        backlog_timeout_s: float = 5.0,
        token_required: bool = True,
        outbox_labels: OutboxLabels | None = None,
    ) -> None:
        # With tokens configured: refuse `/metrics` without one (`METRICS_TOKEN_REQUIRED`).
        self.token_required = token_required
        self.outbox_labels = outbox_labels or OutboxLabels()
        # Outboxes that took an item through this API: their refusals keep their own label.
        self._outboxes: set[str] = set()
        self.registry = CollectorRegistry()
        # Read from the read model at scrape time (`refresh`), once the app has its engine.
        self.backlog = BacklogMetrics(
            self.registry,
            cache_s=backlog_cache_s,
            timeout_s=backlog_timeout_s,
            labels=self.outbox_labels,
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
            " (created, existing, rejected, error); a refused enqueue naming an outbox that"
            " does not exist counts under outbox '(unknown)', an outbox without a label of its"
            " own (METRICS_OUTBOX_LABELS) under 'other'.",
            ["outbox", "destination", "result"],
            registry=self.registry,
        )

        self.reports = Counter(
            "outbox_delivery_reports_total",
            "Provider delivery reports by destination and result (applied, unknown: no item"
            " has the message id, early: no item has it yet and the report is recent, sent"
            " back to be delivered again, late: after the item's report window, recorded in its"
            " read-model row, ignored: another event type, invalid: unreadable).",
            ["destination", "result"],
            registry=self.registry,
        )

    def count_reports(self, destination: str, result: str, count: int) -> None:
        """Count a delivery's reports; the destination is a configured one (bounded labels)."""
        if count:
            self.reports.labels(destination, result).inc(count)

    def count_enqueue(self, outbox: str, destination: str, result: str) -> None:
        """Count one enqueue; callers pass only configured destinations. A refused one
        (`rejected`) keeps its outbox's name only if that outbox exists (it took an item here,
        or the read model holds items of it); otherwise it counts under `UNKNOWN_OUTBOX`. An
        outbox without a label of its own (`OutboxLabels`) counts as `other`."""
        if result in ("created", "existing"):
            self._outboxes.add(outbox)
        elif result == "rejected" and outbox != _INVALID_OUTBOX and not self._exists(outbox):
            outbox = UNKNOWN_OUTBOX
        if outbox not in (UNKNOWN_OUTBOX, _INVALID_OUTBOX):
            # A valid enqueue (taken, or failed on the way) admits its outbox while there is
            # room; the labels stay bounded whatever the outbox names.
            if result != "rejected":
                self.outbox_labels.admit(outbox)
            outbox = self.outbox_labels.label(outbox)
        self.enqueued.labels(outbox, destination, result).inc()

    def _exists(self, outbox: str) -> bool:
        return outbox in self._outboxes or self.backlog.knows_outbox(outbox)


async def require_metrics_token(request: Request) -> None:
    """Dependency of `/metrics`: with tokens configured, a bearer token with the `metrics` scope
    (401 without one, 403 with another), unless `token_required` was turned off, when a scrape
    may come without one (a token sent is checked all the same). Without tokens configured
    `/metrics` is open, like the API."""
    tokens: list[auth.ApiToken] = request.app.state.tokens
    if not tokens:
        return
    metrics: ApiMetrics = request.app.state.metrics
    scheme, _, offered = request.headers.get("authorization", "").partition(" ")
    offered = offered.strip() if scheme.lower() == "bearer" else ""
    if not offered:
        if not metrics.token_required:
            return
        raise ApiProblem(
            401,
            "unauthorized",
            "Unauthorized",
            "send 'Authorization: Bearer <token>' with a token that has the 'metrics' scope",
            headers={"WWW-Authenticate": 'Bearer realm="durable-outbox"'},
        )
    token = auth.matching_token(offered, tokens)
    if token is None:
        raise ApiProblem(403, "forbidden", "Forbidden", "the bearer token is not valid")
    # Metrics cover every outbox: a token limited to some outboxes is refused too.
    why = auth.refusal(token, auth.Scope.METRICS, None)
    if why is not None:
        raise ApiProblem(403, "forbidden", "Forbidden", why, missing_scope=auth.Scope.METRICS)


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
