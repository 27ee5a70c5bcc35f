"""Every name the docs and the README write in code spans exists in the code: an API route (or a
prefix of its routes); an environment variable the settings read or the code, the compose file
or the Makefile uses, or one of another program's that the docs tell you to set; an `outbox` CLI
command and its flags (from `cli.py`'s parser); a problem code (from `api/problem_codes.py`);
a metric the API exports; a workflow, signal, update or query name (from the workflow
definitions the worker hosts); and a destinations-file field (from the models its loader
validates with). Any other snake_case name must be one the code base writes somewhere, so a
field the docs invent fails even where nothing says it is one."""

from __future__ import annotations

import argparse
import ast
import functools
import re
import shlex
import tomllib
from pathlib import Path

import pytest
from durable_outbox_temporal.contract.aggregate import RUNS_ENDED_METRIC, RUNS_RESUMED_METRIC
from durable_outbox_temporal.contract.flow_policy import FlowPolicy, Quota
from durable_outbox_temporal.contract.item import POLICY_SETTINGS
from durable_outbox_temporal.destinations import Destination, OutboxSettings
from fastapi.routing import APIRoute, APIWebSocketRoute
from prometheus_client.metrics import MetricWrapperBase
from starlette.routing import Mount
from temporalio.workflow import _Definition

from api.backlog_metrics import FAMILIES
from api.destination_metrics import FAMILIES as DESTINATION_FAMILIES
from api.main import create_app
from api.metrics import ApiMetrics
from api.problem_codes import PROBLEM_CODES
from cli import build_parser
from configuration.providers import PROVIDER_SETTINGS
from configuration.settings import PROJECT_ROOT, Settings
from readmodel.models import metadata
from tests.docs.test_links import _outside_code_blocks
from tests.docs.test_paths import _PATH, SOURCE_ROOTS, pages
from worker import WORKFLOWS

_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_ENV = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")
_ROUTE = re.compile(r"(?:(GET|POST|PUT|PATCH|DELETE|WS) )?(/[\w{}./:*-]*)(?:\?\S*)?")
# The API's own namespaces: other paths in the docs are the fake provider's or an example's.
_API_PREFIXES = ("/v1", "/codec", "/healthz", "/readyz", "/metrics", "/problems", "/docs")
# Other programs' variables the docs tell an operator to set: uvicorn's, the Temporal server's
# and its Web UI's.
OTHER_PROGRAMS = {
    "FORWARDED_ALLOW_IPS",
    "TEMPORAL_AUTH_ENABLED",
    "TEMPORAL_AUTH_CALLBACK_URL",
    "TEMPORAL_AUTH_CLIENT_ID",
    "TEMPORAL_AUTH_CLIENT_SECRET",
    "TEMPORAL_AUTH_PROVIDER_URL",
    "TEMPORAL_TLS_CA",
    "TEMPORAL_TLS_CERT",
    "TEMPORAL_TLS_KEY",
    "TEMPORAL_TLS_CLIENT1_CA_CERT",
    "TEMPORAL_TLS_FRONTEND_CERT",
    "TEMPORAL_TLS_FRONTEND_KEY",
    "TEMPORAL_TLS_REQUIRE_CLIENT_AUTH",
}


def code_spans(page: Path) -> list[str]:
    return [
        match.group(1).strip()
        for line in _outside_code_blocks(page.read_text())
        for match in _CODE_SPAN.finditer(line)
    ]


@functools.cache
def app_routes() -> list[tuple[re.Pattern[str], set[str]]]:
    found: list[tuple[re.Pattern[str], set[str]]] = []

    def walk(routes: list[object], prefix: str) -> None:
        for route in routes:
            inner = getattr(route, "original_router", None)
            if inner is not None:
                walk(inner.routes, prefix + route.include_context.prefix)  # type: ignore[attr-defined]
            elif isinstance(route, APIRoute | APIWebSocketRoute) or hasattr(route, "path"):
                path = prefix + route.path  # type: ignore[attr-defined]
                parts = re.split(r"(\{[^}]+\})", path)
                pattern = "".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts)
                methods = getattr(route, "methods", None) or {"WS"}
                # A mount (static files) serves every path below it.
                below = "(?:/.*)?" if isinstance(route, Mount) else "(/.*)?"
                found.append((re.compile(f"^{pattern}{below}$"), set(methods)))

    walk(create_app().routes, "")
    return found


def route_exists(method: str | None, path: str) -> bool:
    concrete = re.sub(r"\{[^}]+\}", "x", path.rstrip("/")) or "/"
    for pattern, methods in app_routes():
        match = pattern.match(concrete)
        below = match.groups()[0] if match and match.groups() else None
        if match and below is None and (method is None or method in methods):
            return True
    # A prefix (`/v1`, `/codec/`) names the routes under it.
    return method is None and any(
        pattern.pattern.startswith(f"^{re.escape(concrete)}/") for pattern, _ in app_routes()
    )


@functools.cache
def known_variables() -> set[str]:
    read = {name.upper() for name in Settings.model_fields}
    # Constants the docs name (`OLDEST_OPEN_RELEASE`) count too, wherever the code keeps them.
    code = [path for root in SOURCE_ROOTS for path in (PROJECT_ROOT / root).rglob("*.py")]
    sources = [
        *code,
        PROJECT_ROOT / "worker.py",
        PROJECT_ROOT / "cli.py",
        PROJECT_ROOT / "Makefile",
    ]
    sources += [*PROJECT_ROOT.glob("*.yml")]
    used = set().union(*(set(_ENV.findall(path.read_text())) for path in sources))
    used |= set(_ENV.findall((PROJECT_ROOT / "config" / "destinations.toml").read_text()))
    return read | used | OTHER_PROGRAMS


# --- the CLI ------------------------------------------------------------------------------

_CLI_PREFIXES = ("outbox ", ".venv/bin/outbox ")


def _choices(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


@functools.cache
def _cli() -> argparse.ArgumentParser:
    return build_parser()


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: action for action in parser._actions for flag in action.option_strings}


def unknown_cli_words(span: str) -> list[str]:
    """The commands and flags of an `outbox ...` span that `cli.py`'s parser does not have."""
    try:
        words = shlex.split(span.split(" ", 1)[1])
    except ValueError:  # an unclosed quote: prose, not a command line
        words = span.split()[1:]
    unknown = []
    parser = _cli()
    flags = _flags(parser)  # the global flags are taken after the command too
    takes_value = False
    for word in (word.lstrip("[") for word in words):
        if takes_value:  # the value of the flag before
            takes_value = False
        elif flag_written := re.match(r"--[\w-]+", word):
            flag = flag_written.group(0)
            if flag not in flags:
                unknown.append(flag)
            else:
                takes_value = flags[flag].nargs != 0 and "=" not in word
        elif not word.startswith("-") and (commands := _choices(parser)):
            if word not in commands:
                if re.fullmatch(r"[a-z][a-z-]*", word):
                    unknown.append(word)
                break  # a placeholder or an argument: the command ends here
            parser = commands[word]
            flags |= _flags(parser)
    return unknown


# --- problem codes, metrics, workflows ----------------------------------------------------

_KEBAB = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)+")
# A code span a problem code sits in: after an HTTP status ("a 409 `x`"), beside the word
# problem or code, in `"code": "x"`, or as its page `/problems/x`.
_STATUS_BEFORE = re.compile(r"\b[1-5]\d\d:?\s*(?:problem\s*)?\(?$")
_PROBLEM_WORDS = re.compile(r"\b(?:problems?|code)\b", re.IGNORECASE)
_WRITTEN_CODE = re.compile(r'"code": "([a-z-]+)"|^/problems/([a-z-]+)$')


def problem_code_in(span: str, before: str, after: str) -> str | None:
    """The problem code `span` names, judged from its shape and the text around it; None when it
    names none."""
    written = _WRITTEN_CODE.search(span)
    if written:
        return written.group(1) or written.group(2)
    if _KEBAB.fullmatch(span) and (
        _STATUS_BEFORE.search(before) or _PROBLEM_WORDS.search(before[-30:] + after[:20])
    ):
        return span
    return None


@functools.cache
def metric_names() -> set[str]:
    """Every sample name the API exports, its histograms' and counters' series included."""
    api_metrics = ApiMetrics()
    families = [
        (described.name, described.type)
        for value in vars(api_metrics).values()
        if isinstance(value, MetricWrapperBase)
        for described in value.describe()
    ]
    families += [(f.sample_name, f.kind) for f in (*FAMILIES, *DESTINATION_FAMILIES)]
    # The worker's own counters, exported as named (the SDK's exporter adds no suffix).
    families += [
        (metric[0], "worker counter") for metric in (RUNS_ENDED_METRIC, RUNS_RESUMED_METRIC)
    ]
    names = set()
    for name, kind in families:
        names.add(name)
        if kind == "counter":
            names |= {f"{name.removesuffix('_total')}_total", f"{name}_created"}
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count", f"{name}_created"}
    return names


# `outbox_...` names that are not metrics: the read model's tables and the settings' fields.
NOT_METRICS = set(metadata.tables) | set(Settings.model_fields)
_METRIC = re.compile(r"(outbox_[a-z0-9_]+)(?:\{.*\})?(?: \d+)?")


def unknown_metric(span: str) -> str | None:
    """The `outbox_` metric `span` names if the API exports none by that name (a name ending in
    `_` names the metrics it begins)."""
    match = _METRIC.fullmatch(span)
    if match is None or match.group(1) in NOT_METRICS:
        return None
    name = match.group(1)
    if name.endswith("_"):
        return None if any(metric.startswith(name) for metric in metric_names()) else name
    return None if name in metric_names() else name


@functools.cache
def workflow_names() -> dict[str, set[str]]:
    """Each kind (`workflow`, `signal`, `update`, `query`) to the names the worker's workflow
    definitions register (a workflow also by its class's name)."""
    names: dict[str, set[str]] = {
        "workflow": set(),
        "signal": set(),
        "update": set(),
        "query": set(),
    }
    for workflow in WORKFLOWS:
        definition = _Definition.from_class(workflow)
        names["workflow"] |= {str(definition.name), workflow.__name__}
        names["signal"] |= {name for name in definition.signals if name}
        names["update"] |= {name for name in definition.updates if name}
        names["query"] |= {name for name in definition.queries if name}
    return names


_KIND_AFTER = re.compile(r"^\s+(workflow|signal|update|query|queries)s?\b")


def unknown_workflow_name(span: str, after: str) -> str | None:
    """`span` if the word after it says it is a workflow, signal, update or query name that no
    workflow definition registers; a `...Workflow` class name must exist too."""
    kind = _KIND_AFTER.match(after)
    if re.fullmatch(r"[A-Z]\w*Workflow", span):
        return None if span in workflow_names()["workflow"] else span
    if kind is None or not re.fullmatch(r"[A-Za-z_]\w*", span):
        return None
    known = workflow_names()["query" if kind.group(1) == "queries" else kind.group(1)]
    return None if span in known else f"{span} ({kind.group(1)})"


# --- destinations-file fields -------------------------------------------------------------

# A field named without its table: it must be a field of one of them.
ANY_TABLE = "destinations-file"


@functools.cache
def destination_file_fields() -> dict[str, frozenset[str]]:
    """Each table of the destinations file to the fields its loader takes: the models it
    validates with refuse any other (`extra="forbid"`), and the policy's fields sit flat in the
    destination's table (`Destination._gather_policy`)."""
    tables = {
        # `name` is the table's own name and `delivery` is refused: neither is written as a field.
        "destination": set(Destination.model_fields) - {"name", "delivery"} | set(POLICY_SETTINGS),
        "flow": set(FlowPolicy.model_fields),
        "quota": set(Quota.model_fields),
        "settings": set().union(*(model.model_fields for model in PROVIDER_SETTINGS.values())),
        "outbox": set(OutboxSettings.model_fields),
    }
    fields = {table: frozenset(names) for table, names in tables.items()}
    return {**fields, ANY_TABLE: frozenset().union(*fields.values())}


# Assignments the docs write for other files than the destinations file, with where they live.
OTHER_FILES_ASSIGNMENTS = {
    "scopes": "the tokens file's (`api/auth.py`)",
    "actor_field": "an aggregate definition's (`durable_outbox_temporal/aggregate_definition.py`)",
    "depends_on": "an Alembic migration's",
}
_SNAKE = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+")
_FIELD_NAME = re.compile(r"[a-z][a-z0-9_]*")
# `[destinations.<name>.flow] key = 1`, `[outboxes.<name>] key`: a field named with its table.
_TABLE_QUALIFIED = re.compile(r"\[(destinations|outboxes)\.[^\]\s]+?(\.flow|\.settings)?\]\s*(.*)")
_DOTTED = re.compile(r"(flow|settings)\.([a-z][a-z0-9_]*)")
# The docs write TOML with spaces around `=`, which keeps out `?status=sent` and `journal_mode=wal`.
_ASSIGNMENT = re.compile(r"[a-z][a-z0-9_]* = \S")
_OWNER_BEFORE = re.compile(r"\bdestination(?:'s|s')\s*$")


def toml_table(text: str) -> dict[str, object] | None:
    """`text` read as TOML assignments (`a = 1, b = 2` as two lines); None when it is not TOML."""
    lines, depth, start = [], 0, 0
    for index, char in enumerate(text):
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(char, 0)
        # A `, key =` outside brackets starts the next assignment, as a reader takes it.
        if char == "," and depth == 0 and _ASSIGNMENT.match(text[index + 1 :].lstrip()):
            lines.append(text[start:index].strip())
            start = index + 1
    lines.append(text[start:].strip())
    try:
        return tomllib.loads("\n".join(lines))
    except tomllib.TOMLDecodeError:
        return None


def fields_written(table: str, values: dict[str, object]) -> list[tuple[str, str]]:
    """Each (table, key) of `values` given as `table`'s; the tables in a list (`quotas`,
    `key_quotas`) are quotas."""
    written = [(table, key) for key in values]
    for value in values.values():
        if isinstance(value, list):
            quotas = [item for item in value if isinstance(item, dict)]
            written += [pair for quota in quotas for pair in fields_written("quota", quota)]
    return written


def claimed_fields(span: str, before: str) -> list[tuple[str, str]]:
    """Each (table, field) of the destinations file `span` names a field of, judged from its
    shape: qualified by its table (`[destinations.<name>.flow] x = 1`, `flow.x`, `settings.x`),
    written as TOML (`x = 1`, a quota `{per = "1s", max = 10}`), or after "destination's"."""
    if qualified := _TABLE_QUALIFIED.fullmatch(span):
        kind, sub_table, rest = qualified.groups()
        table = "outbox" if kind == "outboxes" else (sub_table or ".destination")[1:]
        if _ASSIGNMENT.match(rest):
            return fields_written(table, toml_table(rest) or {})
        return [(table, rest.split()[0])] if rest else []
    if (dotted := _DOTTED.fullmatch(span)) and not _PATH.match(span):
        return [(dotted.group(1), dotted.group(2))]
    if _ASSIGNMENT.match(span) and span.split(" ", 1)[0] not in OTHER_FILES_ASSIGNMENTS:
        return fields_written(ANY_TABLE, toml_table(span) or {})
    if span.startswith(("{", "[{")):  # a quota or a list of them: a flow table's `quotas`
        quotas = span if span.startswith("[") else f"[{span}]"
        return fields_written("flow", toml_table(f"quotas = {quotas}") or {})
    if _OWNER_BEFORE.search(before) and _FIELD_NAME.fullmatch(span):
        return [(ANY_TABLE, span)]
    return []


@functools.cache
def names_in_the_code() -> set[str]:
    """Every snake_case word the code base writes (sources, tests, configuration, the
    dashboard), and its files' names: what a name the docs write may be."""
    suffixes = {".py", ".toml", ".yml", ".yaml", ".json", ".ini", ".html", ".js", ".mako"}
    files = [
        path
        for root in (*SOURCE_ROOTS, "config")
        for path in (PROJECT_ROOT / root).rglob("*")
        if path.suffix in suffixes and "__pycache__" not in path.parts
    ]
    files += [PROJECT_ROOT / name for name in ("worker.py", "cli.py", "Makefile")]
    files += [*PROJECT_ROOT.glob("*.yml"), *PROJECT_ROOT.glob("*.toml")]
    names = {path.stem for path in files}
    for path in files:
        # Of the tests, the names they define only (tests, fixtures): their strings hold wrong
        # names on purpose, to see them refused.
        if path.is_relative_to(PROJECT_ROOT / "tests") and path.suffix == ".py":
            names |= python_identifiers(path.read_text())
        elif not path.is_relative_to(PROJECT_ROOT / "tests"):
            names |= set(_SNAKE.findall(path.read_text()))
    return names


def python_identifiers(source: str) -> set[str]:
    """The names a module defines and uses: functions, classes, arguments, variables,
    attributes; not its strings."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


# Names the docs write that belong to other programs, not ours.
OTHER_PROGRAMS_NAMES = {
    "max_retries": "Cloudflare Queues' retry setting (docs/explanation/seeds.md)",
    "deprecate_patch": "the Temporal SDK's (`workflow.deprecate_patch`)",
    "pg_restore": "PostgreSQL's restore program",
    "temporal_activity_schedule_to_start_latency": "a metric the Temporal SDK exports",
    "temporal_workflow_task_schedule_to_start_latency": "a metric the Temporal SDK exports",
}


_SUPERSEDED = re.compile(r"^\*\*Superseded\*\*", re.MULTILINE)


def unknown_fields(lines: list[str], *, superseded: bool = False) -> list[str]:
    """The destinations-file fields the code spans of `lines` claim that their table has not,
    and every other snake_case name the code base writes nowhere (unless the page is a
    superseded decision record, which tells what was built then)."""
    unknown: list[str] = []
    for line in lines:
        for match in _CODE_SPAN.finditer(line):
            span = match.group(1).strip()
            if claimed := claimed_fields(span, line[: match.start()]):
                unknown += [
                    f"{key} ({table} field)"
                    for table, key in claimed
                    if key not in destination_file_fields()[table]
                ]
            elif (
                _SNAKE.fullmatch(span)
                and not superseded
                and span not in names_in_the_code()
                and span not in OTHER_PROGRAMS_NAMES
            ):
                unknown.append(span)
    return unknown


def unknown_names(lines: list[str]) -> list[str]:
    """Every name in the code spans of `lines` that the code does not have."""
    unknown: list[str] = []
    for line in lines:
        for match in _CODE_SPAN.finditer(line):
            span = match.group(1).strip()
            before, after = line[: match.start()], line[match.end() :]
            if span.startswith(_CLI_PREFIXES):
                unknown += unknown_cli_words(span)
            code = problem_code_in(span, before, after)
            if code is not None and code not in PROBLEM_CODES:
                unknown.append(code)
            if (metric := unknown_metric(span)) is not None:
                unknown.append(metric)
            if (name := unknown_workflow_name(span, after)) is not None:
                unknown.append(name)
    return unknown


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(PROJECT_ROOT)))
def test_every_command_problem_code_metric_and_workflow_name_exists(page: Path) -> None:
    assert unknown_names(_outside_code_blocks(page.read_text())) == []


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(PROJECT_ROOT)))
def test_every_destination_field_and_snake_case_name_exists(page: Path) -> None:
    text = page.read_text()
    superseded = bool(_SUPERSEDED.search(text))

    assert unknown_fields(_outside_code_blocks(text), superseded=superseded) == []


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(PROJECT_ROOT)))
def test_every_route_and_variable_named_exists(page: Path) -> None:
    unknown = []
    for span in code_spans(page):
        route = _ROUTE.fullmatch(span)
        if route and route.group(2).startswith(_API_PREFIXES):
            if not route_exists(route.group(1), route.group(2)):
                unknown.append(span)
        elif _ENV.fullmatch(span) and span not in known_variables():
            unknown.append(span)
    assert unknown == []


def test_the_check_sees_a_missing_route_and_variable() -> None:
    assert route_exists("POST", "/v1/outboxes/{outbox}/items")
    assert route_exists(None, "/v1")
    assert not route_exists("DELETE", "/v1/outboxes/{outbox}/items")
    assert not route_exists(None, "/v1/outboxes/{outbox}/nothing-here")
    # Built here, so this file does not name it whole.
    assert "DATABASE_URL" in known_variables() and "NO_SUCH_" + "SETTING" not in known_variables()


@pytest.mark.parametrize(
    ("line", "unknown"),
    [
        ("run `outbox items list demo --status sent`", []),
        ("run `outbox items lst demo`", ["lst"]),
        ("run `outbox status demo k1 --no-such-flag`", ["--no-such-flag"]),
        ("`.venv/bin/outbox --output json aggregates state flight BA117`", []),
        ("a 409 `idempotency-conflict`", []),
        ("a 409 `idempotency-clash`", ["idempotency-clash"]),
        ('answers `"code": "no-such-code"`', ["no-such-code"]),
        ("the `fake-email` destination", []),
        ("`outbox_items_enqueued_total{outcome}` counts", []),
        ("`outbox_items_enqueued_count` counts", ["outbox_items_enqueued_count"]),
        ("the `outbox_items` table", []),
        ("the lane's `append_items` update and `request_cancel` signal", []),
        ("the lane's `append` signal", ["append (signal)"]),
        ("a `NoSuchWorkflow` runs", ["NoSuchWorkflow"]),
    ],
)
def test_the_check_sees_each_kind_of_missing_name(line: str, unknown: list[str]) -> None:
    assert unknown_names([line]) == unknown


@pytest.mark.parametrize(
    ("line", "unknown"),
    [
        ("`max_in_flight` caps the requests out at once", []),
        ("`max_inflight` caps the requests out at once", ["max_inflight"]),
        ("set `breaker_probe_interval_s = 30` and `poll_in_submit = true`", []),
        # A name the code has, but not as a field of the destinations file.
        ("set `probe_interval_s = 30`", ["probe_interval_s (destinations-file field)"]),
        ("`submit_rate = 1.5, poll_rate = 2.0`", []),
        ("`submit_rate = 1.5, poll_rates = 2.0`", ["poll_rates (destinations-file field)"]),
        ('`[destinations.x.flow] quotas = [{per = "1s", max = 10}]`', []),
        ('`[destinations.x.flow] quotas = [{per = "1s", most = 10}]`', ["most (quota field)"]),
        ("`[destinations.x.flow] submit_rate = 2`", ["submit_rate (flow field)"]),
        ('`[outboxes.billing] lane_policy = "skip"`', []),
        ("`[destinations.fake-email.settings] access_key`", []),
        ("`settings.max_retry_after_s` and `flow.adaptive`", []),
        ("`flow.max_retry_after_s`", ["max_retry_after_s (flow field)"]),
        ("the destination's `events_secret`", []),
        ("the destination's `task_queue`", ["task_queue (destinations-file field)"]),
        # Not claims: a file, a query string, Python, JSON, another file's TOML.
        ("`flow.py`, `?include_discarded=true`, `down_revision = None`", []),
        ('`{"enabled": boolean}` and a tokens-file entry with `scopes = ["metrics"]`', []),
        (
            '`{per = "1h", max = 5000}` and `[{per = "1s", maximum = 10}]`',
            ["maximum (quota field)"],
        ),
    ],
)
def test_the_check_sees_a_missing_destination_field(line: str, unknown: list[str]) -> None:
    assert unknown_fields([line]) == unknown


def test_the_lists_of_other_names_hold_no_more_than_they_must() -> None:
    # Another file's assignment is still a name of ours; another program's name is not.
    assert set(OTHER_FILES_ASSIGNMENTS) <= names_in_the_code()
    assert not set(OTHER_PROGRAMS_NAMES) & names_in_the_code()
