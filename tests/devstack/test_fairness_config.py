"""The dev server (make dev, tests, bench) and docker-compose's Temporal get the same dynamic
config: fairness, and the dispatch-latency setting."""

from __future__ import annotations

from pathlib import Path

import yaml

from devstack.temporal_server import (
    FAIRNESS_DYNAMIC_CONFIG,
    LATENCY_DYNAMIC_CONFIG,
    dev_server_extra_args,
)

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def test_dev_server_and_compose_enable_the_same_fairness_settings() -> None:
    args = dev_server_extra_args(None)
    dev_values = {args[i + 1] for i, arg in enumerate(args) if arg == "--dynamic-config-value"}
    compose = yaml.safe_load(COMPOSE.read_text())
    dynamic = yaml.safe_load(compose["configs"]["temporal-dynamic-config"]["content"])

    assert FAIRNESS_DYNAMIC_CONFIG["matching.enableFairness"] is True
    for key, value in FAIRNESS_DYNAMIC_CONFIG.items():
        assert f"{key}={str(value).lower()}" in dev_values
        assert dynamic[key] == [{"value": value}]


def test_dev_server_and_compose_read_new_tasks_as_fast() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    dynamic = yaml.safe_load(compose["configs"]["temporal-dynamic-config"]["content"])
    for fairness in (True, False):
        args = dev_server_extra_args(None, fairness=fairness)
        dev_values = {args[i + 1] for i, arg in enumerate(args) if arg == "--dynamic-config-value"}
        for key, value in LATENCY_DYNAMIC_CONFIG.items():
            assert f"{key}={value}" in dev_values
            assert dynamic[key] == [{"value": value}]
