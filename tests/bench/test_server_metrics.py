"""The server's work per item, from its Prometheus text (bench/server_metrics.py)."""

from __future__ import annotations

from bench.server_metrics import difference, parse, per_item


def line(metric: str, operation: str, service: str, value: int, namespace: str = "default") -> str:
    labels = f'namespace="{namespace}",operation="{operation}",service_name="{service}"'
    return f"{metric}{{{labels}}} {value}"


SCRAPE = "\n".join(
    [
        "# TYPE persistence_requests counter",
        line("persistence_requests", "UpdateWorkflowExecution", "history", 30),
        line("persistence_requests", "UpdateWorkflowExecution", "history", 2, "system"),
        line("persistence_requests", "CreateWorkflowExecution", "history", 3),
        line("persistence_requests", "ReadHistoryBranch", "history", 7),
        line("persistence_requests", "CreateTasks", "matching", 4),
        line("persistence_requests", "GetNamespace", "frontend", 9),
        "# TYPE visibility_persistence_requests counter",
        line("visibility_persistence_requests", "RecordWorkflowExecutionStarted", "history", 3),
        line("visibility_persistence_requests", "RecordWorkflowExecutionClosed", "history", 3),
        "# TYPE service_requests counter",
        line("service_requests", "RespondWorkflowTaskCompleted", "frontend", 9),
        line("service_requests", "RespondWorkflowTaskCompleted", "history", 9),
        line("service_requests", "AddActivityTask", "matching", 6),
        "",
    ]
)


def test_each_figure_sums_its_operations_over_labels_and_ignores_the_rest() -> None:
    totals = parse(SCRAPE)
    assert totals == {
        "history_writes": 35,  # both namespaces' updates and the creates
        "history_reads": 7,
        "matching_task_writes": 4,
        "visibility_writes": 6,
        "workflow_tasks": 9,  # the frontend's, not the history service's too
        "matched_activity_tasks": 6,
    }


def test_per_item_is_the_summed_differences_over_the_items() -> None:
    before = parse(SCRAPE)
    after = {figure: value + 3 for figure, value in before.items()}
    after["history_writes"] += 27
    rounds = [difference(before, after), difference(after, after)]
    totals = {figure: sum(r[figure] for r in rounds) for figure in before}
    assert per_item(totals, 3) == {
        "history_writes": 10.0,
        "history_reads": 1.0,
        "matching_task_writes": 1.0,
        "visibility_writes": 1.0,
        "workflow_tasks": 1.0,
        "matched_activity_tasks": 1.0,
    }
