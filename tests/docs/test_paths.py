"""Every file path the docs name in code spans (`workflows/delivery.py`) exists, so a move that
leaves a page behind fails here. Paths inside the Temporal-level client may be written from its
package (`durable_outbox_temporal/client.py`), as Python readers import it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from configuration.settings import PROJECT_ROOT
from tests.docs.test_links import _INLINE_CODE, _outside_code_blocks, markdown_files

CLIENT_SRC = PROJECT_ROOT / "clients" / "temporal" / "src"
# A repository path: folders and a file with a known extension, or a folder ending in `/`.
_PATH = re.compile(r"^[A-Za-z_][\w.-]*(/[\w.-]+)*(\.(py|md|toml|yml|yaml|ini|json|mako|html)|/)$")
# Files a running stack makes, not the repository's.
_MADE_AT_RUN_TIME = (".data/", ".bench/", ".venv/")


def named_paths(page: Path) -> list[str]:
    paths = []
    for line in _outside_code_blocks(page.read_text()):
        for match in _INLINE_CODE.finditer(line):
            text = match.group(2).strip()
            # `file.py:function` and `file.py` `Class` name a file too.
            text = text.split(":")[0].split(" ")[0]
            if "/" in text and _PATH.match(text) and not text.startswith(_MADE_AT_RUN_TIME):
                paths.append(text)
    return paths


def exists(path: str, page: Path) -> bool:
    candidates = [PROJECT_ROOT / path, CLIENT_SRC / path, page.parent / path]
    return any(candidate.exists() for candidate in candidates)


def pages() -> list[Path]:
    return [*markdown_files(), *sorted((PROJECT_ROOT / "clients").glob("*/README.md"))]


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(PROJECT_ROOT)))
def test_every_named_path_exists(page: Path) -> None:
    assert [path for path in named_paths(page) if not exists(path, page)] == []


def test_the_check_sees_paths_and_misses() -> None:
    page = PROJECT_ROOT / "docs" / "explanation" / "architecture.md"
    named = named_paths(page)
    assert "workflows/delivery.py" in named and "durable_outbox_temporal/client.py" in named
    assert exists("durable_outbox_temporal/client.py", page)
    assert not exists("outbox_client/client.py", page)


# The source folders whose docstrings and comments name files (tests included: they mirror them).
SOURCE_ROOTS = [
    "workflows",
    "activities",
    "api",
    "service",
    "flowcontrol",
    "readmodel",
    "configuration",
    "devstack",
    "bench",
    "examples",
    "tests",
    "clients",
]
_CODE_SPAN = re.compile(r"`([^`\n]+)`")


def named_in_source(source: Path) -> list[str]:
    named = []
    for line in source.read_text().splitlines():
        for match in _CODE_SPAN.finditer(line):
            text = match.group(1).strip().split(":")[0].split(" ")[0]
            # A folder alone (`scope/`) is too often a key's prefix: only files count here.
            if "/" in text and _PATH.match(text) and not text.endswith("/"):
                named.append(text)
    return named


def test_every_path_a_docstring_or_comment_names_exists() -> None:
    sources = [
        PROJECT_ROOT / "worker.py",
        PROJECT_ROOT / "cli.py",
        *(
            path
            for root in SOURCE_ROOTS
            for path in sorted((PROJECT_ROOT / root).rglob("*.py"))
            if "histories" not in path.parts and ".venv" not in path.parts
        ),
    ]
    missing = [
        f"{source.relative_to(PROJECT_ROOT)}: {path}"
        for source in sources
        for path in named_in_source(source)
        if not path.startswith(_MADE_AT_RUN_TIME) and not exists(path, source)
    ]

    assert len(sources) > 300
    assert missing == []
