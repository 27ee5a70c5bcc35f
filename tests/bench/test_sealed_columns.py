"""The sealing-cost bench writes what it says it measures: sealed rows when given keys."""

from __future__ import annotations

from bench.sealed_columns import lifecycle, main


def test_a_lifecycle_carries_its_payload_once_and_ends_sent() -> None:
    projections = lifecycle("k")

    assert [p.payload is not None for p in projections] == [True, False, False]
    assert projections[-1].view.status.value == "sent"


def test_the_bench_runs_a_round(capsys) -> None:
    main(["--items", "3", "--rounds", "1"])

    out = capsys.readouterr().out
    assert "round 1: plain" in out and "median sealed/plain" in out
