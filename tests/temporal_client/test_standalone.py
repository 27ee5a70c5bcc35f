"""The Temporal-level client installs and imports on its own: temporalio, pydantic, cryptography
and the standard library, nothing of the service's packages or its web and database layers."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from configuration.settings import PROJECT_ROOT
from tests.rest_client.test_standalone import top_level_imports

CLIENT_ROOT = PROJECT_ROOT / "clients" / "temporal"
PACKAGE = CLIENT_ROOT / "src" / "durable_outbox_temporal"
REQUIRED = {"temporalio", "pydantic", "cryptography", "annotated_types"}
# Imported only by the modules of an optional extra, and only when it is asked for.
OPTIONAL = {"sqlalchemy": "sqlalchemy", "opentelemetry": "opentelemetry"}
# The service's web and database layers: the client must import with none of them installed.
SERVICE_LIBRARIES = ["fastapi", "starlette", "uvicorn", "sqlmodel", "alembic", "psycopg"]


def service_packages() -> list[str]:
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
    roots: list[str] = project["tool"]["importlinter"]["root_packages"]
    own = [root for root in roots if root != "durable_outbox_temporal"]
    return [*own, *project["tool"]["setuptools"]["py-modules"], "devstack", "bench", "examples"]


def test_the_package_imports_only_its_declared_libraries() -> None:
    modules = sorted(PACKAGE.rglob("*.py"))
    imported = set().union(*(top_level_imports(module) for module in modules))

    assert len(modules) > 20
    assert imported - sys.stdlib_module_names - {"durable_outbox_temporal"} == REQUIRED | set(
        OPTIONAL
    )


def test_its_declared_dependencies_match_what_it_imports() -> None:
    project = tomllib.loads((CLIENT_ROOT / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {r.split(">")[0].split("=")[0].split("[")[0].strip() for r in requirements}

    # annotated_types comes with pydantic, which the contract's models are built on.
    assert names(project["dependencies"]) == {"temporalio", "pydantic", "cryptography"}
    extras = project["optional-dependencies"]
    assert "sqlalchemy" in names(extras["sqlalchemy"])
    assert "opentelemetry-sdk" in names(extras["opentelemetry"])


def test_it_imports_and_enqueues_with_the_service_hidden(tmp_path: Path) -> None:
    """Every service package and the web and database libraries made unimportable, the client
    still imports every module of its core, reads a destinations file and builds its clients."""
    (tmp_path / "destinations.toml").write_text(
        '[destinations.mail]\nprovider = "acs-email"\nsubmit_rate = 2.0\npoll_rate = 2.0\n'
        '[destinations.mail.settings]\nendpoint = "http://127.0.0.1:1/acs"\n'
    )
    program = f"""
import importlib, pkgutil, sys
from importlib.abc import MetaPathFinder
from pathlib import Path

HIDDEN = {[*service_packages(), *SERVICE_LIBRARIES, *OPTIONAL]!r}

class Hide(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            raise ImportError(f"{{name}} imported")
        return None

sys.meta_path.insert(0, Hide())
import durable_outbox_temporal
from durable_outbox_temporal import OutboxClient
from durable_outbox_temporal.aggregates import AggregateClient
from durable_outbox_temporal.destinations import DestinationRegistry

OPTIONAL_MODULES = {{"durable_outbox_temporal.transactional",
                    "durable_outbox_temporal.contract.outbox_pending",
                    "durable_outbox_temporal.contract.sealed_columns"}}
for module in pkgutil.walk_packages(durable_outbox_temporal.__path__, "durable_outbox_temporal."):
    if module.name not in OPTIONAL_MODULES:
        importlib.import_module(module.name)

destinations = DestinationRegistry.from_file(
    Path({str(tmp_path / "destinations.toml")!r}), provider_settings=None
)
print(destinations.get("mail").provider)
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
    assert ran.stdout.split("\n")[:2] == ["acs-email", "[]"]


def test_the_transactional_outbox_needs_only_sqlalchemy_beside_it() -> None:
    program = f"""
import sys
from importlib.abc import MetaPathFinder

HIDDEN = {[*service_packages(), *SERVICE_LIBRARIES]!r}

class Hide(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            raise ImportError(f"{{name}} imported")
        return None

sys.meta_path.insert(0, Hide())
from sqlalchemy import create_engine
from sqlalchemy.orm import Session
from durable_outbox_temporal.contract.outbox_pending import OUTBOX_PENDING_TABLE
from durable_outbox_temporal.transactional import enqueue_in

engine = create_engine("sqlite://")
OUTBOX_PENDING_TABLE.metadata.create_all(engine)
with Session(engine) as session, session.begin():
    key = enqueue_in(session, outbox="billing", destination="mail", payload={{"n": 1}}, key="k1")
with engine.connect() as connection:
    print(key, connection.execute(OUTBOX_PENDING_TABLE.select()).one().status)
"""
    ran = subprocess.run(
        [sys.executable, "-I", "-c", program],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=CLIENT_ROOT,
    )

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "k1 pending"
