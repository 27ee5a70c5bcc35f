"""A measured figure in prose carries its date (issue 44): a paragraph of README.md or docs/ that
states one names the day it was measured (`YYYY-MM-DD`), or sits under a heading that does.

A measured figure is a throughput of things the product moves (`45.6 items/s`, `500 commands a
second`), a percentile latency (`p99 150 ms`), CPU (`2.9 ms of CPU`, `3% of a core`), a
before-and-after time (`95.9 → 22.3 ms`) or a byte rate (`12 MB/s`). Settings and limits are
not: a load the bench puts on (`at 20 items/s`), a rate (`5/s`), an interval or a timeout
(`every 0.2 s`), a bar (`p99 ≤ 100 ms`). A paragraph is a block between blank lines or a list
item; a table takes the date of the paragraph that introduces it. Fenced code and the generated
reference pages are not prose."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from configuration.settings import PROJECT_ROOT
from devstack.reference_docs import REFERENCE_DIR
from tests.docs.test_links import _FENCE, _HEADING, markdown_files

_NUMBER = r"(?<![\w.])\d[\d,]*(?:\.\d+)?"
_SPREAD = rf"{_NUMBER}\s*(?:to|–|-|→)\s*{_NUMBER}"
# A single figure after "at" is the load a run was given, a spread after it what it measured.
_THROUGHPUT = (
    rf"(?:{_SPREAD}|(?<!\bat ){_NUMBER})\s*"
    r"(?:items?|commands?|rows?|deliveries|applied|delivered)\s*(?:/s\b|(?:a|per) second)"
)
# A percentile and its value in one clause, unless a comparator makes it a bar.
_PERCENTILE = (
    r"\b(?:p50|p95|p99|median)\b(?:\s*/\s*p\d\d)?"
    r"(?:(?![.;]\s|≤|<|\bunder\b|\bbelow\b|\bat most\b|\bwithin\b)[^|]){0,40}?"
    rf"(?:{_SPREAD}|{_NUMBER})(?:\s*/\s*{_NUMBER})?\s*(?:ms|µs|s)\b"
)
_CPU = (
    rf"(?:{_SPREAD}|{_NUMBER})\s*"
    r"(?:%\s*of (?:a|one) core|%\s*of the [\w']+ CPU|(?:ms|s) of (?:\w+ ){0,4}CPU)"
)
_BEFORE_AND_AFTER = rf"{_NUMBER}\s*(?:ms|µs)?\s*→\s*(?:{_SPREAD}|{_NUMBER})\s*(?:ms|µs)\b"
_BYTE_RATE = rf"(?:{_SPREAD}|{_NUMBER})\s*(?:MB|MiB|GB|GiB)/s\b"
MEASURED = re.compile(
    "|".join(
        f"(?:{pattern})"
        for pattern in (_THROUGHPUT, _PERCENTILE, _CPU, _BEFORE_AND_AFTER, _BYTE_RATE)
    )
)
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
_LIST_ITEM = re.compile(r"^\s{0,3}(?:[-*+]|\d+[.)])\s")


def paragraphs(text: str) -> Iterator[tuple[str, str]]:
    """Each paragraph of a page's prose, with the heading it sits under; a table comes joined to
    the paragraph just before it."""
    heading, block, fence = "", [], ""
    previous: str | None = None  # the paragraph before, under the same heading

    def finish() -> Iterator[tuple[str, str]]:
        nonlocal block, previous
        if block:
            paragraph = " ".join(line.strip() for line in block)
            if block[0].lstrip().startswith("|") and previous is not None:
                paragraph = f"{previous} {paragraph}"
            previous = paragraph
            yield heading, paragraph
        block = []

    for line in text.splitlines():
        opening = _FENCE.match(line)
        if fence:
            if opening and opening.group(1)[0] == fence[0] and len(opening.group(1)) >= len(fence):
                fence = ""
            continue
        if opening:
            yield from finish()
            fence = opening.group(1)
        elif title := _HEADING.match(line):
            yield from finish()
            heading, previous = title.group(2), None
        elif not line.strip():
            yield from finish()
        else:
            if _LIST_ITEM.match(line):
                yield from finish()
            block.append(line)
    yield from finish()


def undated_figures(text: str) -> list[str]:
    """Each paragraph of `text` that states a measured figure with no date in it or its heading,
    shortened to its start and the figures found."""
    undated = []
    for heading, paragraph in paragraphs(text):
        figures = [match.group(0) for match in MEASURED.finditer(paragraph)]
        if figures and not DATE.search(paragraph) and not DATE.search(heading):
            undated.append(f"{paragraph[:60]}… {figures}")
    return undated


def prose_pages() -> list[Path]:
    return [page for page in markdown_files() if not page.is_relative_to(REFERENCE_DIR)]


@pytest.mark.parametrize(
    "page", prose_pages(), ids=lambda page: str(page.relative_to(PROJECT_ROOT))
)
def test_every_measured_figure_in_prose_carries_its_date(page: Path) -> None:
    assert undated_figures(page.read_text()) == []


@pytest.mark.parametrize(
    "prose",
    [
        "One lane delivered 45.6 items/s.",
        "about 500 commands a second from 30 clients",
        "a lane ran at 40 to 45 items a second",
        "the GET's p99 was 267 ms",
        "measured p50 / p99: visibility query 4.0 / 13.5 ms",
        "saved the server 2.9 ms of CPU per item",
        "about 3% of the worker's CPU",
        "worker CPU per item 28.1 → 12.6–14.2 ms",
        "- a list item: 3,542 applied/s",
    ],
)
def test_a_measured_figure_without_a_date_is_found(prose: str) -> None:
    assert undated_figures(prose) != []
    assert undated_figures(f"{prose} (2026-11-25)") == []
    assert undated_figures(f"## Run of 2026-11-25\n\n{prose}") == []


@pytest.mark.parametrize(
    "prose",
    [
        "The relay polls every 0.2 s, with a timeout of 30 s.",
        "Temporal allows 10 updates in flight per workflow.",
        "a webhook at 5/s, delivery at 20 items/s",
        "the highest fixed rate keeping p99 ≤ 100 ms; p99 under 100 ms is the bar",
        "```\n45.6 items/s\n```",
    ],
)
def test_a_setting_or_a_limit_is_no_measured_figure(prose: str) -> None:
    assert undated_figures(prose) == []


def test_a_table_takes_the_date_of_the_paragraph_before_it_and_list_items_stand_alone() -> None:
    table = "| figure | value |\n|---|---|\n| p99 | p99 149.1 ms |\n"
    undated_item = "Runs of 2026-11-25:\n\n- one lane 45.6 items/s\n"

    assert undated_figures(f"Run of 2026-11-25:\n\n{table}") == []
    assert undated_figures(f"A run:\n\n{table}") != []
    assert undated_figures(undated_item) != []
