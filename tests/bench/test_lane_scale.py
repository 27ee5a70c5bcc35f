"""The judge of `bench.lane_scale` and the destinations file it writes: each check passes a clean
run and fails exactly its own defect."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos_analysis import SubmitAnswer
from bench.lane_scale import (
    DESTINATION,
    OUTBOX,
    SHARDS,
    Findings,
    destinations_toml,
    findings_problems,
    history_events,
    judge_arrivals,
)
from configuration.destinations import load_destinations

T0 = 1_800_000_000.0


def answer(at: float, status: int = 204) -> SubmitAnswer:
    return SubmitAnswer(arrived_at=at, answered_at=at + 0.01, status=status)


Arrival = tuple[int, int, float]
Submits = dict[tuple[int, int], list[SubmitAnswer]]


def clean_run(appenders: int, per_appender: int) -> tuple[list[Arrival], Submits]:
    """The appenders' items interleaved, each accepted once, a second apart."""
    arrivals: list[Arrival] = []
    submits: Submits = {}
    for i in range(per_appender):
        for a in range(appenders):
            at = T0 + len(arrivals)
            arrivals.append((a, i, at))
            submits[(a, i)] = [answer(at)]
    return arrivals, submits


def test_a_clean_run_passes() -> None:
    arrivals, submits = clean_run(3, 4)
    findings = judge_arrivals(3, 4, arrivals, submits)
    assert findings == Findings(
        delivered=12, lost=0, duplicates=0, out_of_order=0, late_submits=0, resubmits_deduped=0
    )
    assert findings_problems(findings, 12) == []


def test_a_missing_item_is_lost() -> None:
    arrivals, submits = clean_run(3, 4)
    findings = judge_arrivals(3, 4, arrivals[:-1], submits)
    assert (findings.lost, findings.delivered) == (1, 11)
    assert findings_problems(findings, 12) == ["1 of 12 items never arrived"]


def test_an_item_arriving_twice_is_a_duplicate() -> None:
    arrivals, submits = clean_run(2, 3)
    # Appender 0's first item twice in a row (later, it would be out of order too).
    findings = judge_arrivals(2, 3, [arrivals[0], *arrivals], submits)
    assert (findings.duplicates, findings.lost) == (1, 0)
    assert findings_problems(findings, 6) == ["1 duplicate deliveries"]


def test_an_item_before_one_its_client_appended_earlier_is_out_of_order() -> None:
    arrivals, submits = clean_run(2, 3)
    # Appender 0's items 1 and 2 swapped; appender 1's order is untouched.
    swapped = [arrivals[0], arrivals[1], arrivals[4], arrivals[3], arrivals[2], arrivals[5]]
    findings = judge_arrivals(2, 3, swapped, submits)
    assert findings.out_of_order == 1
    assert findings.late_submits == 0  # each submit came before the later item's arrival
    assert len(findings_problems(findings, 6)) == 1


def test_a_resubmit_before_the_next_item_is_deduped_not_late() -> None:
    arrivals, submits = clean_run(1, 3)
    # Item 0 accepted twice (a worker killed before it recorded the answer), before item 1.
    submits[(0, 0)] = [answer(T0 - 1, 503), answer(T0), answer(T0 + 0.5)]
    findings = judge_arrivals(1, 3, arrivals, submits)
    assert (findings.resubmits_deduped, findings.late_submits) == (1, 0)
    assert findings_problems(findings, 3) == []


def test_a_submit_after_a_later_item_arrived_is_late() -> None:
    arrivals, submits = clean_run(1, 3)
    # Item 0 submitted again once item 2 had arrived (at T0 + 2): the provider deduped it.
    submits[(0, 0)] = [answer(T0), answer(T0 + 2.5)]
    findings = judge_arrivals(1, 3, arrivals, submits)
    assert (findings.late_submits, findings.out_of_order) == (1, 0)
    assert findings_problems(findings, 3) == [
        "1 submits of an item came after a later item had arrived"
        " (no worker kill since the item's first arrival)"
    ]


def test_a_run_sent_again_after_a_kill_is_counted_apart_not_late() -> None:
    arrivals, submits = clean_run(1, 3)
    # Items 0 to 2 went in one run; the worker was killed before the run's answer, and the run's
    # retry sent all three again, under their keys (the provider deduped them).
    kill = T0 + 2.2
    for i in range(3):
        submits[(0, i)].append(answer(T0 + 3 + i / 10))
    findings = judge_arrivals(1, 3, arrivals, submits, [kill])
    assert (findings.late_submits, findings.late_resubmits_after_kills) == (0, 2)
    assert findings_problems(findings, 3) == []


def test_a_kill_before_the_first_arrival_does_not_excuse_a_late_submit() -> None:
    arrivals, submits = clean_run(1, 3)
    submits[(0, 0)] = [answer(T0), answer(T0 + 2.5)]
    findings = judge_arrivals(1, 3, arrivals, submits, [T0 - 1])
    assert (findings.late_submits, findings.late_resubmits_after_kills) == (1, 0)


def test_another_clients_later_items_do_not_make_a_submit_late() -> None:
    arrivals, submits = clean_run(2, 2)
    # Appender 0's item 1 retried after appender 1's item 1 arrived: order is per client.
    submits[(0, 1)] = [answer(T0 + 1.5, 503), answer(T0 + 3.5)]
    assert judge_arrivals(2, 2, arrivals, submits).late_submits == 0


@pytest.mark.parametrize(
    ("items", "expected"), [(50, 100), (1_000, 1_000), (10_000, 10_000), (50_000, 10_000)]
)
def test_the_lane_history_limit_is_the_item_count_within_bounds(items: int, expected: int) -> None:
    assert history_events(items) == expected


@pytest.mark.parametrize("mode", ["item", "bulk"])
def test_the_destinations_file_loads_in_each_mode(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "destinations.toml"
    path.write_text(destinations_toml(mode, 1_000))
    registry = load_destinations(path, {"FAKE_PROVIDER_URL": "http://127.0.0.1:9"})
    destination = registry.get(DESTINATION)
    assert destination is not None
    assert destination.mode == mode
    if mode == "bulk":
        assert destination.shards == SHARDS
    assert destination.settings["url"] == f"http://127.0.0.1:9/webhook/{DESTINATION}"
    assert registry.outbox(OUTBOX).lane_history_events == 1_000
