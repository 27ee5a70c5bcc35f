"""Ports handed out to tests' servers: never twice while a test may still be starting its server."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import ports

PICKS = 300
ROOT = Path(__file__).resolve().parents[1]


def _picks_in_processes(reservations: Path, processes: int) -> list[list[int]]:
    code = (
        "import sys\nfrom pathlib import Path\nfrom tests.ports import free_port\n"
        f"print(' '.join(str(free_port(Path(sys.argv[1]))) for _ in range({PICKS})))\n"
    )
    running = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(reservations)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    return [
        [int(port) for port in process.communicate(timeout=60)[0].split()] for process in running
    ]


def test_ports_picked_at_once_by_several_processes_are_all_different(tmp_path: Path) -> None:
    # Picked at random from about 12,000 ports, 900 picks would repeat one almost surely
    # (the birthday bound) if nothing kept them apart.
    picks = _picks_in_processes(tmp_path, processes=3)

    every = [port for process in picks for port in process]
    assert [len(process) for process in picks] == [PICKS] * 3
    assert len(set(every)) == len(every)


def test_a_reserved_port_is_not_handed_out_until_its_reservation_is_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken, stale, fresh = 20011, 20012, 20013
    (tmp_path / str(taken)).touch()
    (tmp_path / str(stale)).touch()
    long_ago = time.time() - ports.RESERVATION_S - 1
    os.utime(tmp_path / str(stale), (long_ago, long_ago))
    offered = iter([taken, stale, taken, fresh])
    monkeypatch.setattr(ports.random, "randint", lambda low, high: next(offered))

    assert ports.free_port(tmp_path) == stale
    assert ports.free_port(tmp_path) == fresh
    assert (tmp_path / str(stale)).stat().st_mtime > long_ago
