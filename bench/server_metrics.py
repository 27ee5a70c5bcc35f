"""The Temporal server's own work per item, counted from its Prometheus metrics.

CPU per item on a 2-core machine shared by the server, the workers, the fake provider and the
bench swings between identical runs; the number of persistence operations the server performs
per item does not (docs/decisions/bench-alternating-rounds.md). So the bench reads the dev
server's `/metrics` before and after each scenario and divides the difference by the items
delivered:

- `history_writes`: `persistence_requests` of `CreateWorkflowExecution` and
  `UpdateWorkflowExecution` (each a transaction on the server's database);
- `history_reads`: of `ReadHistoryBranch`, `GetWorkflowExecution` and `GetCurrentExecution`;
- `matching_task_writes`: of `CreateTasks` (tasks no poller was waiting for, kept in the database);
- `visibility_writes`: `visibility_persistence_requests`;
- `workflow_tasks`: `service_requests` of `RespondWorkflowTaskCompleted` at the frontend;
- `matched_activity_tasks`: of `AddActivityTask` at matching (an eager activity skips it).

Each is summed over its other labels.
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx
from prometheus_client.parser import text_string_to_metric_families

# figure -> (metric name, operation label values, service_name label or None for any)
FIGURES: dict[str, tuple[str, frozenset[str], str | None]] = {
    "history_writes": (
        "persistence_requests",
        frozenset({"CreateWorkflowExecution", "UpdateWorkflowExecution"}),
        "history",
    ),
    "history_reads": (
        "persistence_requests",
        frozenset({"ReadHistoryBranch", "GetWorkflowExecution", "GetCurrentExecution"}),
        "history",
    ),
    "matching_task_writes": ("persistence_requests", frozenset({"CreateTasks"}), "matching"),
    "visibility_writes": ("visibility_persistence_requests", frozenset(), "history"),
    "workflow_tasks": (
        "service_requests",
        frozenset({"RespondWorkflowTaskCompleted"}),
        "frontend",
    ),
    "matched_activity_tasks": ("service_requests", frozenset({"AddActivityTask"}), "matching"),
}


def parse(text: str) -> dict[str, float]:
    """Each figure's counter total in one scrape of the server's metrics."""
    totals = dict.fromkeys(FIGURES, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for figure, (name, operations, service) in FIGURES.items():
                if sample.name not in (name, f"{name}_total"):
                    continue
                if operations and sample.labels.get("operation") not in operations:
                    continue
                if service is not None and sample.labels.get("service_name") != service:
                    continue
                totals[figure] += sample.value
    return totals


async def scrape(url: str) -> dict[str, float]:
    """The figures' counter totals now, from the server's `/metrics` at `url`."""
    async with httpx.AsyncClient(timeout=10) as http:
        response = await http.get(url)
        response.raise_for_status()
    return parse(response.text)


def difference(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """What the server did between two scrapes."""
    return {figure: after[figure] - before[figure] for figure in FIGURES}


def per_item(totals: Mapping[str, float], items: int) -> dict[str, float]:
    """`totals` (summed differences) per item."""
    return {
        figure: round(totals[figure] / items, 2) if items else float("nan") for figure in FIGURES
    }
