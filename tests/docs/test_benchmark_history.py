"""docs/benchmarks.md's history of dated runs is complete and in order: every day and every
date and time its body dates a run by (`YYYY-MM-DD HH:MM`, or a span `YYYY-MM-DD HH:MM–HH:MM`)
has an entry there, newest first, each entry linking to where the run is told."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from configuration.settings import PROJECT_ROOT

PAGE = PROJECT_ROOT / "docs" / "benchmarks.md"
HISTORY_HEADING = "## History of dated runs"
_TIME = r"\d{2}:\d{2}"
# A date, then a time or a span of times if the run has them (an en dash or a hyphen between).
_DATED = re.compile(
    rf"\b(\d{{4}}-\d{{2}}-\d{{2}})(?:,? ({_TIME})(?:\s*[–-]\s*({_TIME}))?)?(?![\d:])"
)
_ENTRY = re.compile(rf"^- \*\*(\d{{4}}-\d{{2}}-\d{{2}})(?: ({_TIME})(?:–({_TIME}))?)?\*\* — ")
_LINK = re.compile(r"\]\((?:#[\w-]+|[\w./-]+\.md(?:#[\w-]+)?)\)")


@dataclass(frozen=True)
class Dated:
    """A day, and the times (first and last) of the run or runs it names; none for a day alone."""

    day: str
    first: str | None = None
    last: str | None = None

    def covers(self, other: Dated) -> bool:
        if self.day != other.day:
            return False
        if other.first is None:
            return True
        if self.first is None:
            return False
        last = self.last or self.first
        return all(self.first <= time <= last for time in (other.first, other.last or other.first))

    def __str__(self) -> str:
        times = f" {self.first}" + (f"–{self.last}" if self.last else "") if self.first else ""
        return self.day + times


def split(text: str) -> tuple[str, str]:
    """The page's body and its history section."""
    body, heading, history = text.partition(HISTORY_HEADING)
    assert heading, f"no {HISTORY_HEADING!r} in {PAGE.name}"
    return body, history


def dated_in(body: str) -> list[Dated]:
    return [Dated(*match.groups()) for match in _DATED.finditer(body)]


def entries(history: str) -> list[tuple[Dated, str]]:
    """Each entry of the history list, with its text (its wrapped lines joined)."""
    found: list[tuple[Dated, str]] = []
    for line in history.splitlines():
        if entry := _ENTRY.match(line):
            found.append((Dated(*entry.groups()), line))
        elif line.startswith("  ") and found:
            found[-1] = (found[-1][0], f"{found[-1][1]} {line.strip()}")
    return found


def missing_from_history(text: str) -> list[str]:
    body, history = split(text)
    listed = [dated for dated, _ in entries(history)]
    return sorted({str(d) for d in dated_in(body) if not any(e.covers(d) for e in listed)})


def test_every_run_dated_in_the_body_is_in_the_history() -> None:
    assert missing_from_history(PAGE.read_text()) == []


def test_the_history_is_newest_first() -> None:
    listed = [dated for dated, _ in entries(split(PAGE.read_text())[1])]
    # A day's entries without a time come after its timed ones.
    keys = [(dated.day, dated.first or "") for dated in listed]

    assert len(listed) > 50
    assert keys == sorted(keys, reverse=True)


def test_every_history_entry_links_to_where_its_run_is_told() -> None:
    unlinked = [text for _, text in entries(split(PAGE.read_text())[1]) if not _LINK.search(text)]

    assert unlinked == []


@pytest.mark.parametrize(
    ("body", "history", "missing"),
    [
        ("Run of 2026-11-28 16:38, quick.", "- **2026-11-28 16:38** — x", []),
        ("Run of 2026-11-28 16:38, quick.", "- **2026-11-28 16:30** — x", ["2026-11-28 16:38"]),
        ("Runs of 2026-11-28 19:24-19:33.", "- **2026-11-28 19:24–19:33** — x", []),
        (
            "Runs of 2026-11-28 19:24-19:40.",
            "- **2026-11-28 19:24–19:33** — x",
            ["2026-11-28 19:24–19:40"],
        ),
        ("First run, 2026-11-28 10:35–11:02,", "- **2026-11-28 10:35–11:02** — x", []),
        ("(2026-11-26, a different machine)", "- **2026-11-26 18:46** — x", []),
        ("(2026-11-23)", "- **2026-11-24** — x", ["2026-11-23"]),
        # A day alone in the list does not answer for a timed run of that day.
        ("2026-11-24 12:00 run", "- **2026-11-24** — x", ["2026-11-24 12:00"]),
    ],
)
def test_the_check_sees_a_run_missing_from_the_history(
    body: str, history: str, missing: list[str]
) -> None:
    assert missing_from_history(f"{body}\n\n{HISTORY_HEADING}\n\n{history}\n") == missing
