"""docker-compose.yml, Makefile and CI must match the code (no Docker engine runs here)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from common.search_attributes import ALL
from common.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
APP_SERVICES = ("api", "worker", "fake-provider")


def command_of(service: str) -> list[str]:
    command = SERVICES[service]["command"]
    return command if isinstance(command, list) else shlex.split(command)


def test_every_service_has_an_image_or_build() -> None:
    for name, service in SERVICES.items():
        assert "image" in service or "build" in service, name


def test_app_commands_point_at_real_modules() -> None:
    assert command_of("worker") == ["python", "worker.py"]
    assert (ROOT / "worker.py").exists()
    api = command_of("api")
    assert "api.main:create_app" in api and "--factory" in api
    assert (ROOT / "api" / "main.py").exists()
    fake = command_of("fake-provider")
    assert fake[:3] == ["python", "-m", "devstack.fake_provider"]
    assert (ROOT / "devstack" / "fake_provider.py").exists()


def test_app_environment_names_real_settings() -> None:
    known = {name.upper() for name in Settings.model_fields}
    destination_refs = set(
        re.findall(r"\$\{([A-Z_]+)", (ROOT / "config/destinations.toml").read_text())
    )
    for name in ("api", "worker"):
        for variable in SERVICES[name]["environment"]:
            assert variable in known or variable in destination_refs, (name, variable)


def test_app_database_is_the_compose_postgres() -> None:
    url = SERVICES["api"]["environment"]["DATABASE_URL"]
    postgres = SERVICES["postgres"]["environment"]
    assert url == (
        f"postgresql://{postgres['POSTGRES_USER']}:{postgres['POSTGRES_PASSWORD']}"
        f"@postgres:5432/{postgres['POSTGRES_DB']}"
    )
    assert SERVICES["worker"]["environment"]["TEMPORAL_ADDRESS"] == "temporal:7233"


def test_registered_search_attributes_are_exactly_ours() -> None:
    command = " ".join(SERVICES["temporal-search-attributes"]["command"])
    registered = set(re.findall(r"--name (\w+) --type Keyword", command))
    assert registered == {key.name for key in ALL}


def test_api_port_is_published() -> None:
    api = command_of("api")
    port = api[api.index("--port") + 1]
    assert f"{port}:{port}" in SERVICES["api"]["ports"]


def test_make_and_ci_run_the_suite() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^dev:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    assert "-eq 5" in makefile  # "no tests collected" fails
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci and "set -euo pipefail" in ci


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker CLI")
def test_compose_file_is_valid_for_docker_compose() -> None:
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip("docker compose plugin not installed")
    result = subprocess.run(
        ["docker", "compose", "-f", str(ROOT / "docker-compose.yml"), "config", "--quiet"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
