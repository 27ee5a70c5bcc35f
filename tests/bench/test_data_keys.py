"""The data-key bench runs its rounds and reports the ratio it is for."""

from __future__ import annotations

import pytest

from bench.data_keys import main


def test_the_bench_runs_a_round(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--writes", "3", "--rounds", "1"])

    out = capsys.readouterr().out
    assert "round 1: key looked up" in out and "median looked-up/held" in out
