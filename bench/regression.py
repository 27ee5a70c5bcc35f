"""The regression report: a bench run's figures beside the last committed run's, each figure
that moved by more than its tolerance flagged.

A complete run (no `BENCH_ONLY`) writes its figures to `bench/results/<mode>.json` (quick or
full); committing that file makes it the run the next ones are compared with. The comparison
reads the committed version (`git show HEAD:...`), so a run that has just rewritten the file
still compares with the one before it.

A figure's tolerance is the run-to-run spread where the run measures one (the spread of its
alternating rounds, `<figure>_by_round`), else the relative tolerance of its kind in
`TOLERANCES`. Why these: docs/decisions/bench-regression-report.md
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).parent / "results"
# Relative tolerance by the figure's name: the first suffix or fragment that matches.
TOLERANCES: tuple[tuple[str, float], ...] = (
    # The server's counts per item repeat from run to run (bench-alternating-rounds.md).
    ("server_per_item.", 0.05),
    ("actions_per_item", 0.05),
    # Tail latencies swing most on a shared 2-core machine.
    ("_p99_ms", 0.5),
    # CPU per item swings about 20% between identical runs.
    ("cpu_ms_per_item", 0.25),
)
DEFAULT_TOLERANCE = 0.2
# Figures that say nothing better or worse of the product when they move, flagged as `moved`:
# the baselines' own (naive, DBOS, a run with a control off), what a control held a load to (it
# should equal the setting), and the sizes and counts a scenario chose.
NEUTRAL_PREFIXES = ("naive_", "dbos_")
NEUTRAL_FRAGMENTS = ("_without",)
NEUTRAL = frozenset(
    {
        "quota_key_max_per_s",
        "cap_max_in_flight",
        "cap_key_max_in_flight",
        "relay_rows",
        "batched_signals",
        "batched_signal_applied",
        "batched_signal_runs",
        "raw_signals",
        "raw_signal_applied",
        "raw_signal_runs",
        "adaptive_items",
        "waiting_items",
        "payload_bytes_per_item",
    }
)
# Figures where a lower value is better although their names match HIGHER_IS_BETTER.
LOWER_IS_BETTER = ("priority_wait_ratio", "throttled_share")
# Figures where a higher value is better; for the others (times, CPU, counts) lower is.
HIGHER_IS_BETTER = ("per_s", "ratio", "_sent", "share")


@dataclass(frozen=True)
class Change:
    """One figure in both runs."""

    figure: str
    before: float
    after: float
    tolerance: float  # absolute, in the figure's unit
    flagged: bool

    @property
    def verdict(self) -> str:
        """`better`, `worse`, `moved` (a figure with no better side) or empty when within the
        tolerance."""
        if not self.flagged:
            return ""
        if (
            self.figure in NEUTRAL
            or self.figure.startswith(NEUTRAL_PREFIXES)
            or _named(self.figure, NEUTRAL_FRAGMENTS)
        ):
            return "moved"
        higher = not _named(self.figure, LOWER_IS_BETTER) and _named(self.figure, HIGHER_IS_BETTER)
        return "better" if (self.after > self.before) == higher else "worse"


def _named(figure: str, fragments: tuple[str, ...]) -> bool:
    return any(fragment in figure for fragment in fragments)


def results_path(mode: str) -> Path:
    return RESULTS_DIR / f"{mode}.json"


def committed(mode: str) -> dict[str, Any] | None:
    """The last committed run of this mode, or None if none was committed."""
    path = results_path(mode)
    relative = path.relative_to(path.parents[1])
    # `./`: the path is the working directory's (`HEAD:path` alone is the repository root's,
    # which found nothing, so no run was ever compared).
    shown = subprocess.run(
        ["git", "show", f"HEAD:./{relative.as_posix()}"],
        capture_output=True,
        text=True,
        cwd=path.parents[1],
        check=False,
    )
    if shown.returncode != 0:
        return None
    loaded: dict[str, Any] = json.loads(shown.stdout)
    return loaded


def record(mode: str, report: Mapping[str, Any]) -> Path:
    """Write a complete run's figures as this mode's latest (commit it to compare with it)."""
    path = results_path(mode)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def compare(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[Change]:
    """Every numeric figure both runs have, with whether it moved beyond its tolerance."""
    old, new = dict(_numbers(before)), dict(_numbers(after))
    changes = []
    for figure, value in new.items():
        if figure not in old:
            continue
        tolerance = _tolerance(figure, old[figure], after)
        moved = abs(value - old[figure])
        changes.append(Change(figure, old[figure], value, tolerance, moved > tolerance))
    return changes


def report(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> str:
    """The comparison as a Markdown table, flagged figures first."""
    if before is None:
        return "no committed run of this mode to compare with"
    date = before.get("machine", {}).get("date", "undated")
    changes = sorted(compare(before, after), key=lambda c: (not c.flagged, c.figure))
    lines = [
        f"against the last committed run ({date}):",
        "",
        "| figure | last committed | this run | change | tolerance | |",
        "|---|---|---|---|---|---|",
    ]
    for change in changes:
        relative = (change.after - change.before) / change.before if change.before else 0.0
        lines.append(
            f"| {change.figure} | {change.before:g} | {change.after:g} | {relative:+.1%}"
            f" | ±{change.tolerance:.3g} | {change.verdict.upper()} |"
        )
    flagged = sum(1 for change in changes if change.flagged)
    lines += ["", f"{flagged} of {len(changes)} figures moved beyond their tolerance"]
    return "\n".join(lines)


def _tolerance(figure: str, before: float, after: Mapping[str, Any]) -> float:
    """The spread of the figure's rounds in this run, else its kind's relative tolerance."""
    rounds = after.get(f"{figure}_by_round")
    if isinstance(rounds, list) and len(rounds) > 1:
        return float(max(rounds) - min(rounds))
    relative = next(
        (tolerance for fragment, tolerance in TOLERANCES if fragment in figure),
        DEFAULT_TOLERANCE,
    )
    return abs(before) * relative


def _numbers(figures: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """The numeric figures, nested ones named `outer.inner`; lists and text are skipped."""
    for name, value in figures.items():
        if name in ("machine", "errors"):
            continue
        if isinstance(value, Mapping):
            yield from _numbers(value, f"{prefix}{name}.")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            yield f"{prefix}{name}", float(value)
