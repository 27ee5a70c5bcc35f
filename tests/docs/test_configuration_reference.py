"""The configuration reference lists exactly the environment variables the code reads: those it
reads from the environment (or a copy of it) anywhere in the source, every `Settings` field, and
every `${NAME}` the shipped destinations file refers to; plus the Temporal connection's, which
the library reads (each one is checked to take effect)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from durable_outbox_temporal.connection import load_connect_config
from durable_outbox_temporal.destinations import _ENV_REFERENCE

from configuration.settings import PROJECT_ROOT, Settings
from devstack.reference_docs import REFERENCE_DIR, TEMPORAL_VARIABLES

PAGE = REFERENCE_DIR / "configuration.md"
_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
_LISTED = re.compile(r"^\| `([A-Z][A-Z0-9_]*)` \|", re.MULTILINE)
# Where the environment is read: `os.environ`, a mapping defaulting to it (`environ`,
# `variables`), or the copy a launcher hands its children (`env`).
_ENVIRONMENT_NAMES = {"environ", "env", "variables"}
_SKIPPED_DIRS = {"tests", "build"}


def source_files(root: Path = PROJECT_ROOT) -> list[Path]:
    """Every Python file of the project outside the tests, the virtualenv and build output."""
    files = []
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).parts[:-1]
        if any(
            part in _SKIPPED_DIRS or part.startswith(".") or part.endswith(".egg-info")
            for part in parts
        ):
            continue
        files.append(path)
    return files


def _is_environment(node: ast.expr) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "environ"
    if isinstance(node, ast.Name):
        return node.id in _ENVIRONMENT_NAMES
    if isinstance(node, ast.IfExp):
        return _is_environment(node.body) or _is_environment(node.orelse)
    return False


def _literal(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def variables_read(source: str) -> set[str]:
    """Names the code reads from the environment: `os.getenv("X")`, `environ.get("X")`,
    `environ["X"]`, `environ.setdefault("X", ...)`, `"X" in environ`."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        name = None
        if isinstance(node, ast.Call) and node.args:
            function = node.func
            if isinstance(function, ast.Attribute) and (
                function.attr == "getenv"
                or (
                    function.attr in {"get", "setdefault", "pop"}
                    and _is_environment(function.value)
                )
            ):
                name = _literal(node.args[0])
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            name = _literal(node.slice) if _is_environment(node.value) else None
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In | ast.NotIn):
            name = _literal(node.left) if _is_environment(node.comparators[0]) else None
        if name and _NAME.match(name):
            found.add(name)
    return found


def variables_the_code_reads() -> dict[str, str]:
    """Each variable read, and one place that reads it."""
    read: dict[str, str] = {}
    for path in sorted(source_files()):
        for name in variables_read(path.read_text()):
            read.setdefault(name, str(path.relative_to(PROJECT_ROOT)))
    for name in Settings.model_fields:
        read.setdefault(name.upper(), "configuration/settings.py")
    for path in sorted((PROJECT_ROOT / "config").glob("*.toml")):
        for match in _ENV_REFERENCE.finditer(path.read_text()):
            read.setdefault(match.group(1), str(path.relative_to(PROJECT_ROOT)))
    return read


def variables_listed() -> set[str]:
    return set(_LISTED.findall(PAGE.read_text()))


def test_the_reference_lists_every_variable_the_code_reads() -> None:
    read = variables_the_code_reads()

    missing = {name: where for name, where in read.items() if name not in variables_listed()}

    assert not missing, f"read but not in docs/reference/configuration.md: {missing}"


def test_the_reference_lists_no_variable_the_code_no_longer_reads() -> None:
    read_by_library = {variable.name for variable in TEMPORAL_VARIABLES}

    unread = variables_listed() - set(variables_the_code_reads()) - read_by_library

    assert not unread, f"listed but read nowhere: {sorted(unread)}"


@pytest.mark.parametrize("variable", TEMPORAL_VARIABLES, ids=lambda variable: variable.name)
def test_each_temporal_variable_listed_takes_effect(variable, tmp_path: Path) -> None:
    pem = tmp_path / "some.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\n")
    profiles = tmp_path / "temporal.toml"
    profiles.write_text('[profile.default]\naddress = "a:1"\n[profile.other]\naddress = "b:2"\n')
    values = {
        "TEMPORAL_CONFIG_FILE": str(profiles),
        "TEMPORAL_PROFILE": "other",
        "TEMPORAL_TLS": "true",
    }
    # A profile is read from a file: compare with the file alone.
    baseline_env = (
        {"TEMPORAL_CONFIG_FILE": str(profiles)} if variable.name.endswith("PROFILE") else {}
    )
    value = values.get(variable.name, str(pem) if variable.name.endswith("_PATH") else "x:7")

    baseline = load_connect_config(baseline_env)
    configured = load_connect_config({**baseline_env, variable.name: value})

    assert configured != baseline


def test_the_scan_finds_each_way_of_reading_the_environment() -> None:
    source = """
import os
a = os.environ["A_VAR"]
b = os.environ.get("B_VAR", "x")
c = os.getenv("C_VAR")
d = (os.environ if environ is None else environ).get("D_VAR")
e = env.get("E_VAR")
env.setdefault("F_VAR", "1")
g = "G_VAR" in os.environ
env["NOT_READ"] = "written, not read"
h = settings.get("not_an_env_name")
i = other.get("OTHER_MAPPING")
"""

    assert variables_read(source) == {f"{letter}_VAR" for letter in "ABCDEFG"}
