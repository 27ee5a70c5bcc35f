"""Every relative link in README.md and docs/ leads to a file that exists, and every `#anchor` to
a heading of its target, by GitHub's rules. External links are not fetched."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from configuration.settings import PROJECT_ROOT

# `[text](target)` and `![alt](target "title")`; `[label]: target` reference definitions.
_INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)"
)
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.MULTILINE)
_HTML_LINK = re.compile(r"""<(?:a|img)\b[^>]*?\b(?:href|src)=["']([^"']+)["']""")
_HTML_ANCHOR = re.compile(r"""<[a-z]+\b[^>]*?\b(?:id|name)=["']([^"']+)["']""")
_FENCE = re.compile(r"^\s{0,3}(```+|~~~+)")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1")


def markdown_files(root: Path = PROJECT_ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def _outside_code_blocks(text: str) -> list[str]:
    lines: list[str] = []
    fence = ""
    for line in text.splitlines():
        opening = _FENCE.match(line)
        if fence:
            if opening and opening.group(1)[0] == fence[0] and len(opening.group(1)) >= len(fence):
                fence = ""
        elif opening:
            fence = opening.group(1)
        else:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: lower case, punctuation dropped but `-` and `_`,
    each space a `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a page offers: its headings' slugs (repeats get `-1`, `-2`...), HTML ids."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in _outside_code_blocks(text):
        heading = _HEADING.match(line)
        if heading:
            base = slug(heading.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
        found.update(_HTML_ANCHOR.findall(line))
    return found


def links(text: str) -> list[str]:
    """The link targets of a page's prose (code blocks and inline code are not links)."""
    prose = "\n".join(
        _INLINE_CODE.sub(lambda code: " " * len(code.group(0)), line)
        for line in _outside_code_blocks(text)
    )
    return [
        *_INLINE_LINK.findall(prose),
        *_REFERENCE.findall(prose),
        *_HTML_LINK.findall(prose),
    ]


def broken_links(page: Path, root: Path = PROJECT_ROOT) -> list[str]:
    """Each relative link of `page` whose file or anchor does not exist, and why."""
    broken = []
    for target in links(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
            continue  # http(s), mailto: never fetched
        path_part, _, anchor = target.partition("#")
        path_part = unquote(path_part.split("?", 1)[0])
        resolved = (page.parent / path_part).resolve() if path_part else page
        if path_part.startswith("/"):
            resolved = (root / path_part.lstrip("/")).resolve()
        if not resolved.exists():
            broken.append(f"{target}: no such file {os.path.relpath(resolved, root)}")
        elif (
            anchor
            and resolved.suffix == ".md"
            and unquote(anchor) not in anchors(resolved.read_text())
        ):
            broken.append(f"{target}: no heading #{anchor} in {resolved.name}")
    return broken


@pytest.mark.parametrize(
    "page", markdown_files(), ids=lambda page: str(page.relative_to(PROJECT_ROOT))
)
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_slugs_follow_githubs_rules() -> None:
    assert slug("A 60-second tour") == "a-60-second-tour"
    assert slug("Fault injection at scale — `make chaos`") == "fault-injection-at-scale--make-chaos"
    assert slug("Labour tracking, step by step") == "labour-tracking-step-by-step"
    assert slug("`outbox schedules create`") == "outbox-schedules-create"
    assert slug("What's `snake_case` [here](x.md)?") == "whats-snake_case-here"


def test_repeated_headings_get_numbered_anchors_and_code_is_not_a_heading() -> None:
    page = '# Setup\n## Setup\n```sh\n# Setup\n```\n## Setup\n<a id="custom"></a>\n'

    assert anchors(page) == {"setup", "setup-1", "setup-2", "custom"}


def test_a_broken_file_or_anchor_is_reported_and_code_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n## Step one\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/guide.md#step-one) [self](#intro) [web](https://example.com/nowhere)\n"
        "# Intro\n"
        "[gone](docs/missing.md) [bad anchor](docs/guide.md#step-two)\n"
        "`[not a link](nowhere.md)`\n"
        "```md\n[nor this](nowhere.md)\n```\n"
        "[ref]: docs/absent.md\n"
    )

    assert broken_links(page, root=tmp_path) == [
        "docs/missing.md: no such file docs/missing.md",
        "docs/guide.md#step-two: no heading #step-two in guide.md",
        "docs/absent.md: no such file docs/absent.md",
    ]
