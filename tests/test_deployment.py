"""docker-compose.yml, the Dockerfile, the Makefile and CI must match the code.

No Docker engine runs here, so these read the files and compare them with what the code expects.
"""

from __future__ import annotations

import fnmatch
import importlib
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from common.search_attributes import ALL
from common.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
APP_SERVICES = ("api", "worker", "fake-provider")
DESTINATIONS_TOML = (ROOT / "config" / "destinations.toml").read_text()


def command_of(service: str) -> list[str]:
    command = SERVICES[service]["command"]
    return command if isinstance(command, list) else shlex.split(command)


def environment_of(service: str) -> dict[str, str]:
    environment = SERVICES[service].get("environment", {})
    if isinstance(environment, list):
        return dict(item.split("=", 1) for item in environment)
    return {name: str(value) for name, value in environment.items()}


def flag_value(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def published_ports(service: str) -> set[str]:
    return {str(port) for port in SERVICES[service].get("ports", [])}


def test_every_service_has_an_image_or_build() -> None:
    for name, service in SERVICES.items():
        assert "image" in service or "build" in service, name


def test_app_commands_point_at_real_code() -> None:
    assert command_of("worker") == ["python", "worker.py"]
    assert (ROOT / "worker.py").is_file()

    api = command_of("api")
    app_path = next(arg for arg in api if ":" in arg and not arg.startswith("-"))
    module, attribute = app_path.split(":")
    assert (module, attribute) == ("api.main", "create_app") and "--factory" in api
    assert (ROOT / "api" / "main.py").is_file()
    assert callable(getattr(importlib.import_module(module), attribute))

    fake = command_of("fake-provider")
    assert fake[:3] == ["python", "-m", "devstack.fake_provider"]
    assert (ROOT / "devstack" / "fake_provider.py").is_file()


def test_app_environment_names_only_real_settings() -> None:
    settings = {name.upper() for name in Settings.model_fields}
    referenced = set(re.findall(r"\$\{([A-Z0-9_]+)", DESTINATIONS_TOML))
    destinations = tomllib.loads(DESTINATIONS_TOML)["destinations"]
    override_prefixes = tuple(f"DEST_{name.upper().replace('-', '_')}_" for name in destinations)
    assert {"FAKE_PROVIDER_URL", "FAKE_ACS_ACCESS_KEY", "FAKE_WEBHOOK_SECRET"} <= referenced
    for service in APP_SERVICES:
        for variable in environment_of(service):
            assert (
                variable in settings
                or variable in referenced
                or variable.startswith(override_prefixes)
            ), (service, variable)


def test_api_and_worker_share_one_configuration() -> None:
    api, worker = environment_of("api"), environment_of("worker")
    for name in ("TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "DATABASE_URL", "OUTBOX_CONFIG"):
        assert api[name] == worker[name], name
    # The fake provider checks signatures with the same secrets the worker signs with.
    for name, value in environment_of("fake-provider").items():
        assert worker[name] == value, name


def test_app_database_is_the_compose_postgres() -> None:
    postgres = environment_of("postgres")
    for service in ("api", "worker"):
        url = urlsplit(environment_of(service)["DATABASE_URL"])
        assert url.scheme.startswith("postgresql"), service
        assert url.hostname == "postgres" and (url.port or 5432) == 5432, service
        assert url.username == postgres["POSTGRES_USER"], service
        assert url.password == postgres["POSTGRES_PASSWORD"], service
        assert url.path == f"/{postgres['POSTGRES_DB']}", service


def test_temporal_address_and_provider_url_reach_their_services() -> None:
    host, port = environment_of("worker")["TEMPORAL_ADDRESS"].split(":")
    assert host == "temporal" and f"{port}:{port}" in published_ports("temporal")
    provider = urlsplit(environment_of("worker")["FAKE_PROVIDER_URL"])
    fake_port = flag_value(command_of("fake-provider"), "--port")
    assert provider.hostname == "fake-provider" and str(provider.port) == fake_port
    assert f"{fake_port}:{fake_port}" in published_ports("fake-provider")


def test_outbox_config_path_is_where_the_image_puts_it() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    workdir = re.search(r"^WORKDIR (\S+)", dockerfile, re.M)
    assert workdir is not None and re.search(r"^COPY config ./config$", dockerfile, re.M)
    assert environment_of("worker")["OUTBOX_CONFIG"] == f"{workdir[1]}/config/destinations.toml"


def copied_into_image() -> set[str]:
    """The sources of the Dockerfile's COPY lines."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    return {
        path.rstrip("/").removeprefix("./")
        for line in re.findall(r"^COPY (.+)$", dockerfile, re.M)
        for path in line.split()[:-1]
    }


def test_image_holds_every_module_pip_installs() -> None:
    """`pip install .` fails when a py-module is missing; a missing package fails at import."""
    copied = copied_into_image()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    modules = {f"{name}.py" for name in project["tool"]["setuptools"]["py-modules"]}
    # What the API, the worker and the fake provider import; bench is not part of the image.
    packages = {"common", "workflows", "activities", "api", "readmodel", "devstack", "config"}
    assert modules | packages <= copied


def test_build_context_keeps_what_the_image_copies_and_drops_the_bulk() -> None:
    patterns = [
        line.rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    for source in copied_into_image():
        assert not any(fnmatch.fnmatch(source, pattern) for pattern in patterns), source
    assert {".venv", ".data", ".bench", ".git"} <= set(patterns)


def test_registered_search_attributes_are_exactly_ours() -> None:
    script = "\n".join(command_of("temporal-setup"))
    registered = re.findall(r"--name (\w+) --type Keyword", script)
    assert sorted(registered) == sorted(key.name for key in ALL)
    assert "search-attribute create" in script


def test_api_port_is_published_and_probed() -> None:
    api = command_of("api")
    port = flag_value(api, "--port")
    assert f"{port}:{port}" in published_ports("api")
    assert f"127.0.0.1:{port}/readyz" in " ".join(SERVICES["api"]["healthcheck"]["test"])


def test_dependencies_wait_for_something_that_can_happen() -> None:
    for name, service in SERVICES.items():
        depends_on = service.get("depends_on", {})
        for dependency, rule in depends_on.items() if isinstance(depends_on, dict) else []:
            assert dependency in SERVICES, (name, dependency)
            target = SERVICES[dependency]
            if rule["condition"] == "service_healthy":
                assert "healthcheck" in target, (name, dependency)
            if rule["condition"] == "service_completed_successfully":
                # A one-shot job: it must not be restarted forever once it has succeeded.
                assert str(target.get("restart", "no")).startswith(("no", "on-failure"))


def test_temporal_reads_the_dynamic_config_compose_provides() -> None:
    temporal = SERVICES["temporal"]
    path = environment_of("temporal")["DYNAMIC_CONFIG_FILE_PATH"]
    assert path in {mount["target"] for mount in temporal["configs"]}
    source = next(m["source"] for m in temporal["configs"] if m["target"] == path)
    assert isinstance(yaml.safe_load(COMPOSE["configs"][source]["content"]), dict)


def test_make_and_ci_run_the_suite_and_fail_on_an_empty_run() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for target in ("dev", "test", "install", "lint", "clean", "help"):
        assert re.search(rf"^{target}:", makefile, re.M), target
    test_recipe = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "pytest" in test_recipe and "-eq 5" in test_recipe
    assert "python -m devstack.dev" in makefile
    ci = (ROOT / ".ci" / "run").read_text()
    assert "set -euo pipefail" in ci and "make test" in ci
    assert "exit code 5" in ci and "passed" in ci
    assert (ROOT / ".ci" / "run").stat().st_mode & 0o111


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker CLI")
def test_compose_file_is_valid_for_docker_compose() -> None:
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip("the docker compose plugin is not installed")
    result = subprocess.run(
        ["docker", "compose", "-f", str(ROOT / "docker-compose.yml"), "config", "--quiet"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
