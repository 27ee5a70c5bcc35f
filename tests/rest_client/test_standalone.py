"""The REST client installs and imports on its own: only httpx, pydantic and the standard
library, nothing of the server's packages."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

from configuration.settings import PROJECT_ROOT

CLIENT_ROOT = PROJECT_ROOT / "clients" / "python"
PACKAGE = CLIENT_ROOT / "src" / "durable_outbox_rest"
ALLOWED = {"httpx", "pydantic", "durable_outbox_rest"}


def top_level_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names


def server_packages() -> list[str]:
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
    roots: list[str] = project["tool"]["importlinter"]["root_packages"]
    return [*roots, *project["tool"]["setuptools"]["py-modules"]]


def test_the_package_imports_only_httpx_pydantic_and_the_standard_library() -> None:
    modules = sorted(PACKAGE.glob("*.py"))
    imported = set().union(*(top_level_imports(module) for module in modules))

    assert len(modules) > 3
    assert imported - sys.stdlib_module_names == ALLOWED


def test_its_declared_dependencies_are_httpx_and_pydantic_only() -> None:
    project = tomllib.loads((CLIENT_ROOT / "pyproject.toml").read_text())["project"]
    names = {
        requirement.split(">")[0].split("=")[0].strip() for requirement in project["dependencies"]
    }

    assert names == {"httpx", "pydantic"}


def test_it_imports_with_every_server_package_hidden() -> None:
    """Every server package made unimportable, the client still imports and builds a client."""
    program = f"""
import sys
from importlib.abc import MetaPathFinder

HIDDEN = {server_packages()!r}

class Hide(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            raise ImportError(f"server package {{name}} imported")
        return None

sys.meta_path.insert(0, Hide())
import durable_outbox_rest
from durable_outbox_rest import AsyncOutboxRest, OutboxRest
OutboxRest("http://127.0.0.1:1").close()
print(sorted(name for name in sys.modules if name.partition(".")[0] in HIDDEN))
"""
    ran = subprocess.run(
        [sys.executable, "-I", "-c", program],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=CLIENT_ROOT,
    )

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "[]"
