"""config/prometheus-alerts.yml: well formed, and speaking only of metrics the API exports, with
labels and label values those metrics have; `promtool` checks and unit-tests it where installed."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from api.backlog_metrics import FAMILIES, ITEMS, LANES, RELAY_BACKLOG, Family
from api.destination_metrics import FAMILIES as DESTINATION_FAMILIES
from readmodel.backlog import BACKLOG_STATUSES, BUSY_LANE_STATUSES
from tests.docs.test_links import slug

CONFIG = Path(__file__).resolve().parent.parent / "config"
RULES_FILE = CONFIG / "prometheus-alerts.yml"
RULES: list[dict[str, Any]] = [
    rule for group in yaml.safe_load(RULES_FILE.read_text())["groups"] for rule in group["rules"]
]
BY_NAME = {family.sample_name: family for family in (*FAMILIES, *DESTINATION_FAMILIES)}
# Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"instance", "job"}
# The values a status label can take, where the collector bounds them.
STATUS_VALUES = {
    ITEMS.name: {status.value for status in BACKLOG_STATUSES},
    LANES.name: {status.value for status in BUSY_LANE_STATUSES},
    # `api/backlog_metrics.py` exports the relay's two: rows waiting and rows refused for good.
    RELAY_BACKLOG.name: {"pending", "refused"},
}
RUNBOOK = Path(__file__).resolve().parent.parent / "docs" / "how-to" / "runbook.md"
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "bool", "offset"}


def selectors(expr: str) -> list[tuple[str, dict[str, str]]]:
    """Every series selector of a PromQL expression: its metric name and label matchers."""
    found = []
    for match in re.finditer(r"([a-zA-Z_:][\w:]*)\s*(\(|\{[^}]*\})?", _without_groupings(expr)):
        name, follows = match.group(1), match.group(2) or ""
        if name in KEYWORDS or follows == "(" or re.fullmatch(r"[\d.]+\w*", name):
            continue  # an operator, a function, a number or a duration
        matchers = dict(re.findall(r'(\w+)\s*(?:=~|!~|!=|=)\s*"([^"]*)"', follows))
        found.append((name, matchers))
    return found


def grouping_labels(expr: str) -> set[str]:
    """The labels of every `by (...)`, `without (...)`, `on (...)` and `ignoring (...)`."""
    lists = re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr)
    return {label.strip() for labels in lists for label in labels.split(",") if label.strip()}


def _without_groupings(expr: str) -> str:
    expr = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", expr)
    return re.sub(r"\[[^\]]*\]", " ", expr)  # range durations


@pytest.mark.parametrize("rule", RULES, ids=[rule["alert"] for rule in RULES])
def test_each_rule_is_complete_and_uses_only_exported_metrics(rule: dict[str, Any]) -> None:
    assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}
    assert rule["labels"]["severity"] in {"page", "warning"}
    assert rule["annotations"]["summary"] and rule["annotations"]["description"]

    used = selectors(rule["expr"])
    families: list[Family] = []
    for name, matchers in used:
        assert name in BY_NAME, f"{rule['alert']}: {name} is not a metric the API exports"
        family = BY_NAME[name]
        families.append(family)
        assert set(matchers) <= set(family.labels), f"{rule['alert']}: {name}{matchers}"
        if "status" in matchers:
            assert matchers["status"] in STATUS_VALUES[family.name], (name, matchers)
    assert families, f"{rule['alert']}: no metric found in {rule['expr']!r}"
    known_labels = TARGET_LABELS.union(*(family.labels for family in families))
    assert grouping_labels(rule["expr"]) <= known_labels, rule["alert"]


def test_the_parser_finds_what_a_wrong_rule_names() -> None:
    expr = 'max by (outbox) (rate(outbox_item_sent_total{outbox="a"}[5m])) > 0.5 and on() up'

    assert selectors(expr) == [("outbox_item_sent_total", {"outbox": "a"}), ("up", {})]
    assert grouping_labels(expr) == {"outbox"}


def test_the_rules_watch_backlog_age_dead_letters_and_halted_lanes() -> None:
    watched = {name for rule in RULES for name, _ in selectors(rule["expr"])}

    assert {
        "outbox_oldest_queued_age_seconds",
        "outbox_items",
        "outbox_items_failed_total",
        "outbox_lanes",
        "outbox_backlog_scrape_ok",
        "outbox_destination_paused",
        "outbox_destination_circuit_open",
        "outbox_relay_lag_seconds",
    } <= watched


@pytest.mark.parametrize("rule", RULES, ids=[rule["alert"] for rule in RULES])
def test_each_rule_links_to_its_runbook_entry(rule: dict[str, Any]) -> None:
    page, _, anchor = rule["annotations"]["runbook_url"].partition("#")
    headings = {slug(match) for match in re.findall(r"^#+ (.+)$", RUNBOOK.read_text(), re.M)}

    assert page == "docs/how-to/runbook.md"
    assert anchor == rule["alert"].lower() and anchor in headings


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool not installed (Debian: prometheus)"
)
def test_promtool_checks_the_rules_and_passes_their_unit_tests() -> None:
    checked = subprocess.run(
        ["promtool", "check", "rules", str(RULES_FILE)], capture_output=True, text=True
    )
    tested = subprocess.run(
        ["promtool", "test", "rules", "prometheus-alerts.test.yml"],
        cwd=CONFIG,
        capture_output=True,
        text=True,
    )

    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(RULES)} rules found" in checked.stdout
    assert tested.returncode == 0, tested.stdout + tested.stderr
