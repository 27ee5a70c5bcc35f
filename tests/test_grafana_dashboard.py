"""config/grafana-dashboard.json: every query is PromQL `promtool` accepts, and names only
metrics, labels and label values that a real stack exports. The API's `/metrics` and the
workers' Temporal SDK metrics are scraped after a little traffic: an item sent, one failed at
the head of an ordering lane, a delivery report."""

from __future__ import annotations

import contextlib
import copy
import json
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from durable_outbox_temporal.contract.ids import item_workflow_id, provider_idempotency_key
from temporalio.client import Client

from tests.api.conftest import api_settings, open_api
from tests.api.test_delivery_reports import data as report_data
from tests.api.test_delivery_reports import grid_event
from tests.conftest import email_destination, webhook_destination
from tests.ports import free_port
from tests.workflows.test_lane import wait_for
from worker import default_operations_task_queue, worker_runtime

CONFIG = Path(__file__).resolve().parent.parent / "config"
DASHBOARD_FILE = CONFIG / "grafana-dashboard.json"
DASHBOARD: dict[str, Any] = json.loads(DASHBOARD_FILE.read_text())
OUTBOX = "grafana"
EVENTS_SECRET = "grafana-events-secret-0123456789"
# Labels Prometheus adds to every scraped series.
TARGET_LABELS = frozenset({"instance", "job"})
# The samples a `# TYPE` line stands for when the scrape shows none of them (a labelled counter
# nothing has counted yet), by the text format's naming rules: a counter's or gauge's samples
# carry the declared name (`prometheus_client` declares its counters with `_total`).
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("", "_sum", "_count")}
TYPE_LINE = re.compile(r"# TYPE (?P<name>[a-zA-Z_:][\w:]*) (?P<type>\w+)")
SAMPLE_LINE = re.compile(r"(?P<name>[a-zA-Z_:][\w:]*)(?P<labels>\{.*\})?\s+\S+(\s+\S+)?")
SAMPLE_LABEL = re.compile(r'([a-zA-Z_]\w*)="((?:[^"\\]|\\.)*)"')
# Grafana's interval variables; every other variable stands in a label matcher's value.
INTERVAL_VARIABLES = {"__rate_interval", "__interval", "__range"}
GRAFANA_VARIABLE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")
LABEL_VALUES = re.compile(r"label_values\(\s*(?:(?P<selector>.*),)?\s*(?P<label>\w+)\s*\)", re.S)

_STRING = r""""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'"""
TOKENS = re.compile(
    rf"""(?P<string>{_STRING}|`[^`]*`)
    |(?P<matchers>\{{(?:[^}}"']|{_STRING})*\}})
    |(?P<range>\[[^\]]*\])
    |(?P<number>(?:\d|\.\d)[\w.]*)
    |(?P<name>[a-zA-Z_:][\w:]*)
    |(?P<open>\()
    |(?P<close>\))
    |(?P<other>\S)""",
    re.X,
)
MATCHER = re.compile(rf"([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*({_STRING})")
GROUPINGS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
AGGREGATION_CLAUSES = {"by", "without"}
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}


@dataclass(frozen=True)
class Query:
    """One PromQL expression of the dashboard, with Grafana's variables filled in."""

    where: str
    promql: str
    # For a `label_values(selector, label)` template variable: the label it lists.
    lists_label: str | None = None


@dataclass
class Selector:
    """A series selector: a metric name and its label matchers (label: (operator, value))."""

    name: str
    matchers: dict[str, tuple[str, str]]


@dataclass
class Parsed:
    """What a query reads: its selectors, and the labels it groups or matches on."""

    selectors: list[Selector] = field(default_factory=list)
    grouping_labels: set[str] = field(default_factory=set)


def panels(within: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, including those inside a collapsed row."""
    for panel in within:
        yield panel
        yield from panels(panel.get("panels", []))


def fill(expr: str) -> str:
    """The expression as Prometheus would get it: intervals as a duration, other variables as
    a plain value (so a variable standing where a metric name belongs shows up as unknown)."""

    def value(match: re.Match[str]) -> str:
        return "5m" if (match.group(1) or match.group(2)) in INTERVAL_VARIABLES else "x"

    return GRAFANA_VARIABLE.sub(value, expr)


def queries(dashboard: dict[str, Any]) -> list[Query]:
    """Every panel target's `expr` and every query variable's PromQL."""
    found = [
        Query(f"panel {panel['title']!r} {target['refId']}", fill(target["expr"]))
        for panel in panels(dashboard["panels"])
        for target in panel.get("targets", [])
    ]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]
        text = query["query"] if isinstance(query, dict) else query
        match = LABEL_VALUES.fullmatch(text.strip())
        assert match, f"${variable['name']}: {text!r} is not label_values(...)"
        where = f"variable ${variable['name']}"
        found.append(Query(where, fill(match["selector"] or ""), match["label"]))
    return found


def parse(promql: str) -> Parsed:
    """The selectors and grouping labels of a PromQL expression (a tokenizer, not a parser:
    enough to tell metric names from functions, keywords, labels and durations)."""
    tokens = [(match.lastgroup, match.group()) for match in TOKENS.finditer(promql)]
    parsed = Parsed()
    position = 0
    while position < len(tokens):
        kind, text = tokens[position]
        following = tokens[position + 1] if position + 1 < len(tokens) else ("end", "")
        position += 1
        if kind == "name" and text in GROUPINGS and following[0] == "open":
            position += 1
            while position < len(tokens) and tokens[position][0] != "close":
                if tokens[position][0] == "name":
                    parsed.grouping_labels.add(tokens[position][1])
                position += 1
        elif kind == "name" and (following[0] == "open" or following[1] in AGGREGATION_CLAUSES):
            continue  # a function, or an aggregation: `sum by (le) (...)`
        elif kind == "name" and text not in KEYWORDS | GROUPINGS:
            matchers = matchers_of(following[1]) if following[0] == "matchers" else {}
            parsed.selectors.append(Selector(text, matchers))
            if following[0] == "matchers":
                position += 1
        elif kind == "matchers":  # `{__name__="..."}` with no name in front
            matchers = matchers_of(text)
            operator, name = matchers.pop("__name__", ("=", ""))
            assert operator == "=", f"{promql!r}: a __name__ pattern names no metric"
            parsed.selectors.append(Selector(name, matchers))
    return parsed


def matchers_of(block: str) -> dict[str, tuple[str, str]]:
    """`{a="x", b=~"y"}` as {"a": ("=", "x"), "b": ("=~", "y")}."""
    return {
        label: (operator, json.loads(value) if value.startswith('"') else value[1:-1])
        for label, operator, value in MATCHER.findall(block)
    }


@dataclass
class Exported:
    """What scrapes exported, as Prometheus stores it: per sample name, the values of each of
    its labels (None for a family without samples, whose labels a scrape cannot show).

    Read line by line rather than with `prometheus_client`'s parser, which renames a counter's
    samples to end in `_total` where Prometheus keeps the name as exposed (the Temporal SDK's
    `temporal_request`).
    """

    labels: dict[str, dict[str, set[str]] | None] = field(default_factory=dict)

    def add(self, text: str) -> None:
        families: dict[str, str] = {}
        for line in text.splitlines():
            if declared := TYPE_LINE.fullmatch(line):
                families[declared["name"]] = declared["type"]
            elif sample := SAMPLE_LINE.fullmatch(line):
                labels = self.labels.get(sample["name"]) or {}
                for label, value in SAMPLE_LABEL.findall(sample["labels"] or ""):
                    labels.setdefault(label, set()).add(value)
                self.labels[sample["name"]] = labels
        for name, kind in families.items():
            for suffix in SUFFIXES.get(kind, ("",)):
                self.labels.setdefault(name + suffix, None)


def problems(dashboard: dict[str, Any], exported: Exported) -> list[str]:
    """Every metric, label or label value a query names that the scrapes did not export."""
    return [problem for query in queries(dashboard) for problem in query_problems(query, exported)]


def query_problems(query: Query, exported: Exported) -> list[str]:
    parsed = parse(query.promql)
    if not parsed.selectors:
        return [] if query.lists_label else [f"{query.where}: no metric in {query.promql!r}"]
    found = []
    known_labels: set[str] | None = set(TARGET_LABELS)
    for selector in parsed.selectors:
        labels = exported.labels.get(selector.name)
        if selector.name not in exported.labels:
            found.append(f"{query.where}: {selector.name} is not exported")
        if labels is None:  # unknown, or a family without samples: its labels are not known
            known_labels = None
            continue
        if known_labels is not None:
            known_labels |= set(labels)
        for label, (operator, value) in selector.matchers.items():
            if label not in labels and label not in TARGET_LABELS:
                found.append(f"{query.where}: {selector.name} has no label {label}")
            elif operator == "=" and label in labels and value not in labels[label]:
                found.append(f"{query.where}: {selector.name}{{{label}={value!r}}} never seen")
    wanted = parsed.grouping_labels | ({query.lists_label} if query.lists_label else set())
    if known_labels is not None and wanted - known_labels:
        found.append(f"{query.where}: labels {sorted(wanted - known_labels)} not exported")
    return found


async def scrape_after_traffic(dev_env, stack_factory, fake_provider) -> Exported:
    """The API's and the workers' metrics, after an item sent, one failed at a lane's head and
    a delivery report. The workers export SDK metrics as `worker.py` configures them."""
    worker_metrics = f"127.0.0.1:{free_port()}"
    runtime = worker_runtime(worker_metrics)
    client = await Client.connect(
        dev_env.client.service_client.config.target_host,
        namespace=dev_env.client.namespace,
        runtime=runtime,
        data_converter=dev_env.client.data_converter,
    )
    email = email_destination(fake_provider, events_secret=EVENTS_SECRET)
    webhook = webhook_destination(fake_provider)
    stack = await stack_factory(email, webhook, env=dev_env, client=client)
    settings = api_settings(
        workflow_task_queue=stack.task_queue,
        operations_task_queue=default_operations_task_queue(stack.task_queue),
        backlog_metrics_cache_s=0,
    )
    sent, refused = (f"{name}-{uuid.uuid4().hex[:6]}" for name in ("sent", "refused"))
    await fake_provider.admin.script(
        provider_idempotency_key(item_workflow_id(OUTBOX, refused)), [{"status": 400}]
    )
    exported = Exported()
    async with contextlib.aclosing(open_api(stack, settings)) as opened:
        http = await anext(opened)
        for key, lane in ((sent, None), (refused, f"lane-{refused}")):
            response = await http.post(
                f"/v1/outboxes/{OUTBOX}/items",
                json={"destination": webhook.name, "payload": {"key": key}, "ordering_key": lane},
                headers={"Idempotency-Key": key},
            )
            assert response.status_code == 202, response.text
        report = grid_event(report_data(str(uuid.uuid4()), "ada@example.com", "Delivered"))
        response = await http.post(
            f"/v1/destinations/{email.name}/events", params={"secret": EVENTS_SECRET}, json=[report]
        )
        assert response.status_code == 200, response.text
        exported.add(await scrape_when_settled(http, webhook.name))
    async with httpx.AsyncClient() as scraper:
        exported.add((await scraper.get(f"http://{worker_metrics}/metrics")).text)
    return exported


async def scrape_when_settled(http: httpx.AsyncClient, destination: str) -> str:
    """`/metrics` once the read model shows the item sent and the lane halted."""
    pair = f'destination="{destination}",outbox="{OUTBOX}"'
    scraped = [""]

    async def settled() -> bool:
        scraped[0] = (await http.get("/metrics")).text
        return (
            f"outbox_items_sent_total{{{pair}}} 1.0" in scraped[0]
            and f'outbox_lanes{{outbox="{OUTBOX}",status="halted"}} 1.0' in scraped[0]
        )

    await wait_for(settled)
    return scraped[0]


async def test_the_dashboard_names_only_metrics_a_real_stack_exports(
    dev_env, stack_factory, fake_provider
) -> None:
    exported = await scrape_after_traffic(dev_env, stack_factory, fake_provider)

    assert problems(DASHBOARD, exported) == []
    # The same check finds a misspelt metric, and a label the (SDK's) metric lacks.
    doctored = copy.deepcopy(DASHBOARD)
    targets = [
        target for panel in panels(doctored["panels"]) for target in panel.get("targets", [])
    ]
    first, last = targets[0], targets[-1]
    first["expr"] = first["expr"].replace("outbox_items{", "outbox_item{")
    last["expr"] = last["expr"].replace("by (", "by (route, ")
    found = problems(doctored, exported)
    assert len(found) == 2, found
    assert "outbox_item is not exported" in found[0]
    assert "labels ['route'] not exported" in found[1]


def test_the_dashboard_charts_what_an_operator_glances_at() -> None:
    charted = {
        selector.name for query in queries(DASHBOARD) for selector in parse(query.promql).selectors
    }
    variables = {variable["name"]: variable for variable in DASHBOARD["templating"]["list"]}

    assert {
        "outbox_items_sent_total",
        "outbox_items_failed_total",
        "outbox_items",
        "outbox_oldest_queued_age_seconds",
        "outbox_lanes",
        "outbox_relay_lag_seconds",
        "outbox_http_requests_total",
        "outbox_http_request_duration_seconds_bucket",
        "outbox_destination_disabled",
        "outbox_destination_submit_rate",
    } <= charted
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"outbox", "destination"} <= set(variables)
    for panel in panels(DASHBOARD["panels"]):
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


def test_the_tokenizer_tells_metrics_from_functions_labels_and_durations() -> None:
    expr = fill(
        "histogram_quantile(0.95, sum by (le, route) (rate(http_seconds_bucket"
        '{route=~"$route", status="5xx"}[$__rate_interval] offset 1h))) * 60'
        ' and on (route) {__name__="up", job="api"} > bool 1e3'
    )

    parsed = parse(expr)

    assert [(selector.name, selector.matchers) for selector in parsed.selectors] == [
        ("http_seconds_bucket", {"route": ("=~", "x"), "status": ("=", "5xx")}),
        ("up", {"job": ("=", "api")}),
    ]
    assert parsed.grouping_labels == {"le", "route"}


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool not installed (Debian: prometheus)"
)
@pytest.mark.parametrize("query", queries(DASHBOARD), ids=lambda query: query.where)
def test_promtool_accepts_each_query(query: Query, tmp_path: Path) -> None:
    if not query.promql:
        pytest.skip("label_values(label) has no selector")
    rules = tmp_path / "rules.yml"
    # JSON is YAML: one recording rule whose expression is the query.
    rule = {"record": "dashboard:query", "expr": query.promql}
    rules.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": [rule]}]}))

    checked = subprocess.run(
        ["promtool", "check", "rules", str(rules)], capture_output=True, text=True
    )

    assert checked.returncode == 0, checked.stdout + checked.stderr
