"""The regression report (`bench/regression.py`): which figures it flags, and which way."""

from __future__ import annotations

from bench import regression

BEFORE = {
    "machine": {"date": "2026-11-25T11:45:00+00:00"},
    "items_per_s": 40.0,
    "ratio_vs_naive": 1.3,
    "cpu_ms_per_item": 40.0,
    "enqueue_p99_ms": 40.0,
    "server_per_item": {"history_writes": 7.0},
    "errors": {"lanes": "x"},
}


def flagged(after: dict[str, object]) -> dict[str, str]:
    return {c.figure: c.verdict for c in regression.compare(BEFORE, after) if c.flagged}


def test_a_figure_within_its_tolerance_is_not_flagged() -> None:
    after = {
        "items_per_s": 35.0,  # -12.5%, within 20%
        "ratio_vs_naive": 1.25,
        "ratio_vs_naive_by_round": [1.2, 1.3, 1.4],  # this run's rounds spread 0.2
        "cpu_ms_per_item": 48.0,  # +20%, within 25%
        "enqueue_p99_ms": 55.0,  # +37.5%, within 50%
        "server_per_item": {"history_writes": 7.2},  # within 5%
    }

    assert flagged(after) == {}


def test_figures_beyond_their_tolerance_are_flagged_better_or_worse() -> None:
    after = {
        "items_per_s": 50.0,
        "ratio_vs_naive": 1.1,
        "ratio_vs_naive_by_round": [1.08, 1.1, 1.12],  # a tight run: 0.2 is beyond its spread
        "cpu_ms_per_item": 28.0,
        "enqueue_p99_ms": 90.0,
        "server_per_item": {"history_writes": 8.0},
        "new_figure": 1.0,  # nothing to compare with
    }

    assert flagged(after) == {
        "items_per_s": "better",
        "ratio_vs_naive": "worse",
        "cpu_ms_per_item": "better",
        "enqueue_p99_ms": "worse",
        "server_per_item.history_writes": "worse",
    }


def test_a_figure_where_less_is_better_is_judged_so_whatever_its_name() -> None:
    before = {
        "priority_wait_ratio": 0.1,
        "adaptive_throttled_share": 0.01,
        "bulk_ratio_vs_naive": 5.0,
    }
    after = {
        "priority_wait_ratio": 0.2,
        "adaptive_throttled_share": 0.04,
        "bulk_ratio_vs_naive": 6.5,
    }

    assert {c.figure: c.verdict for c in regression.compare(before, after)} == {
        "priority_wait_ratio": "worse",  # urgent items waited longer against the others
        "adaptive_throttled_share": "worse",  # more of the submits refused
        "bulk_ratio_vs_naive": "better",
    }


def test_a_baselines_figures_and_a_scenarios_sizes_only_moved() -> None:
    # figure, last committed, this run, verdict
    cases = [
        ("naive_items_per_s", 20.0, 25.0, "moved"),
        ("dbos_items_per_s", 40.0, 30.0, "moved"),
        ("naive_cpu_ms_per_item", 78.0, 50.0, "moved"),
        ("caps_items_per_s_without", 30.0, 40.0, "moved"),
        ("quota_key_max_per_s", 5.0, 7.0, "moved"),  # should equal the quota: not a speed
        ("waiting_items", 10000.0, 1000.0, "moved"),
        ("waiting_items_sent", 10000.0, 900.0, "worse"),  # the product's: fewer sent
    ]
    before = {figure: old for figure, old, _, _ in cases}
    after = {figure: new for figure, _, new, _ in cases}

    assert {c.figure: c.verdict for c in regression.compare(before, after)} == {
        figure: verdict for figure, _, _, verdict in cases
    }


def test_the_report_names_the_reference_run_and_counts_the_flagged() -> None:
    text = regression.report(BEFORE, {"items_per_s": 20.0, "cpu_ms_per_item": 40.0})

    assert "2026-11-25T11:45:00+00:00" in text
    assert "| items_per_s | 40 | 20 | -50.0% |" in text and "WORSE" in text
    assert text.endswith("1 of 2 figures moved beyond their tolerance")
    assert regression.report(None, {"items_per_s": 1.0}).startswith("no committed run")


def test_the_committed_run_of_a_mode_is_found() -> None:
    """The reference is the run committed at HEAD (both modes are committed)."""
    for mode in ("quick", "full"):
        reference = regression.committed(mode)
        assert reference is not None, mode
        assert reference["machine"]["mode"] == mode
