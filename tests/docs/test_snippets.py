"""Every fenced snippet in the docs is what it claims to be: a `toml` one loads through the
destinations loader (a fragment onto the shipped destination it extends), a `json` one parses,
a `python` one compiles. A page that shows a configuration the loader refuses fails here."""

from __future__ import annotations

import ast
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from durable_outbox_temporal.destinations import DestinationConfigError, DestinationRegistry

from configuration.providers import PROVIDER_SETTINGS
from configuration.settings import PROJECT_ROOT
from tests.docs.test_paths import pages

_FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_CHECKED = ("toml", "json", "python")
SHIPPED = tomllib.loads((PROJECT_ROOT / "config" / "destinations.toml").read_text())["destinations"]
# A page on adding a provider kind shows a kind the registry cannot know yet.
_NEW_KIND_PAGE = "add-a-provider.md"


def snippets(page: Path) -> list[tuple[str, int, str]]:
    text = page.read_text()
    return [
        (match.group(1), text[: match.start()].count("\n") + 1, match.group(2))
        for match in _FENCE.finditer(text)
        if match.group(1) in _CHECKED
    ]


def environ_for(body: str) -> dict[str, str]:
    """A value for each `${VAR}` a snippet names, of the shape the settings ask for."""
    values = {}
    for name in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", body):
        if name.endswith("URL"):
            values[name] = "http://127.0.0.1:8025"
        elif "SECRET" in name:
            values[name] = "whsec_ZmFrZS13ZWJob29rLXNpZ25pbmctc2VjcmV0"
        else:
            values[name] = "ZmFrZS1hY3MtYWNjZXNzLWtleQ=="
    return values


def onto_shipped(destinations: dict[str, Any]) -> dict[str, Any]:
    """A fragment without a provider extends the shipped destination of that name."""
    merged = {}
    for name, fields in destinations.items():
        base = SHIPPED.get(name, {}) if "provider" not in fields else {}
        merged[name] = {**base, **fields}
        for table in ("settings", "flow"):
            if table in base and table in fields:
                merged[name][table] = {**base[table], **fields[table]}
    return merged


def check(language: str, body: str, page: Path, line: int) -> None:
    where = f"{page.relative_to(PROJECT_ROOT)}:{line}"
    if language == "json":
        json.loads(body)
    elif language == "python":
        compile(body, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    else:
        raw = tomllib.loads(body)
        if "destinations" not in raw:
            return
        settings = None if page.name == _NEW_KIND_PAGE else PROVIDER_SETTINGS
        shipped = {name: SHIPPED[name] for name in SHIPPED if name not in raw["destinations"]}
        DestinationRegistry.from_mapping(
            {**shipped, **onto_shipped(raw["destinations"])},
            environ_for(body) | environ_for(json.dumps(shipped)),
            source=where,
            provider_settings=settings,
        )


CASES = [
    pytest.param(language, body, page, line, id=f"{page.relative_to(PROJECT_ROOT)}:{line}")
    for page in pages()
    for language, line, body in snippets(page)
]


@pytest.mark.parametrize(("language", "body", "page", "line"), CASES)
def test_the_snippet_is_what_it_says(language: str, body: str, page: Path, line: int) -> None:
    check(language, body, page, line)


def test_the_check_refuses_a_wrong_snippet() -> None:
    page = PROJECT_ROOT / "docs" / "how-to" / "configure.md"
    assert len(CASES) > 20
    with pytest.raises(DestinationConfigError):
        check("toml", '[destinations.fake-email]\nsubmit_rate = "fast"\n', page, 1)
    with pytest.raises(json.JSONDecodeError):
        check("json", '{"minutes": [...]}', page, 1)
    with pytest.raises(SyntaxError):
        check("python", "def f(:\n", page, 1)
