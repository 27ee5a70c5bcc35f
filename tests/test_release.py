"""The release: one version (configuration/version.py) that the package, the two clients, the
CLI, /healthz and the changelog agree on; the changelog names every patch id and migration."""

from __future__ import annotations

import re
import tomllib

import httpx
import pytest

from api.main import create_app
from configuration.settings import PROJECT_ROOT
from configuration.version import VERSION
from readmodel.db import MIGRATIONS_DIR
from tests.api.conftest import api_settings

CHANGELOG = (PROJECT_ROOT / "CHANGELOG.md").read_text()
SEMVER = re.compile(r"^\d+\.\d+\.\d+$")


def _pyproject(path: str) -> dict:
    return tomllib.loads((PROJECT_ROOT / path / "pyproject.toml").read_text())


def test_the_version_is_semantic_and_read_from_one_place() -> None:
    assert SEMVER.match(VERSION)
    project = _pyproject(".")["project"]
    assert "version" in project["dynamic"]
    dynamic = _pyproject(".")["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "configuration.version.VERSION"}
    assert f"durable-outbox-temporal=={VERSION}" in project["dependencies"]


@pytest.mark.parametrize("client", ["clients/python", "clients/temporal"])
def test_the_clients_version_in_step_and_say_which_servers_they_support(client: str) -> None:
    assert _pyproject(client)["project"]["version"] == VERSION
    readme = (PROJECT_ROOT / client / "README.md").read_text()
    major_minor = ".".join(VERSION.split(".")[:2])
    assert f"durable-outbox {major_minor}.x" in readme


def test_the_changelog_has_this_release_and_the_first() -> None:
    releases = re.findall(r"^## \[(.+?)\]", CHANGELOG, flags=re.MULTILINE)
    assert releases[0] == "Unreleased"
    assert releases[1] == VERSION and "0.1.0" in releases
    assert all(SEMVER.match(release) for release in releases[1:])
    assert releases[1:] == sorted(releases[1:], key=lambda r: [int(p) for p in r.split(".")])[::-1]


def test_the_changelog_names_every_patch_id() -> None:
    patch_ids = set()
    for path in (PROJECT_ROOT / "workflows").glob("*.py"):
        text = path.read_text()
        for constant in re.findall(r"workflow\.(?:patched|deprecate_patch)\((\w+)\)", text):
            patch_ids |= set(re.findall(rf'^{constant} = "([^"]+)"', text, flags=re.MULTILINE))
    assert len(patch_ids) >= 3
    for patch_id in patch_ids:
        assert f"`{patch_id}`" in CHANGELOG, patch_id


def test_the_changelog_names_the_newest_migration() -> None:
    newest = max(path.name[:4] for path in (MIGRATIONS_DIR / "versions").glob("0*.py"))
    assert f"`{newest}`" in CHANGELOG


async def test_healthz_says_which_release_runs() -> None:
    app = create_app(api_settings())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        response = await http.get("/healthz")
    assert response.json() == {"status": "ok", "version": VERSION}
