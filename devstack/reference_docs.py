"""The reference pages under `docs/reference/`, generated from the code so they cannot drift:
configuration (settings, environment variables, destination fields), the REST API (from the
app's OpenAPI schema), the Temporal contract, the CLI (from its parser), the metrics and the
problem codes (from `api/problem_codes.py`).

    python -m devstack.reference_docs          # rewrite every page
    python -m devstack.reference_docs --check  # exit 1 if a page is stale (the tests run this)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import os
import sys
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import annotated_types
from durable_outbox_temporal.connection import RETIRED_VARIABLES
from durable_outbox_temporal.contract.aggregate import RUNS_ENDED_METRIC, RUNS_RESUMED_METRIC
from durable_outbox_temporal.contract.flow_policy import FlowPolicy
from durable_outbox_temporal.contract.item import DESCRIPTION, POLICY_SETTINGS, DeliveryPolicy
from durable_outbox_temporal.destinations import _ENV_REFERENCE, Destination, OutboxSettings
from fastapi.routing import APIRoute, APIWebSocketRoute, iter_route_contexts
from prometheus_client.metrics import MetricWrapperBase
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from starlette.routing import Mount

import cli
from api.backlog_metrics import FAMILIES
from api.destination_metrics import FAMILIES as DESTINATION_FAMILIES
from api.main import create_app
from api.metrics import ApiMetrics
from api.problem_codes import SECTIONS
from configuration.providers import PROVIDER_SETTINGS
from configuration.settings import PROJECT_ROOT, Settings
from devstack.contract_docs import contract_page

REFERENCE_DIR = PROJECT_ROOT / "docs" / "reference"
COMMAND = "python -m devstack.reference_docs"
SHIPPED_DESTINATIONS = PROJECT_ROOT / "config" / "destinations.toml"


@dataclasses.dataclass(frozen=True)
class Variable:
    """An environment variable read outside `Settings`: its name, default and meaning."""

    name: str
    default: str
    meaning: str


# Read by `temporalio.envconfig` (through `durable_outbox_temporal.connect`), not by our code: the
# names are Temporal's standard, so they are listed here (a test checks that each one takes effect).
TEMPORAL_VARIABLES = (
    Variable("TEMPORAL_ADDRESS", "`localhost:7233`", "Temporal frontend, `host:port`"),
    Variable("TEMPORAL_NAMESPACE", "`default`", "namespace"),
    Variable("TEMPORAL_API_KEY", "unset", "API key (Temporal Cloud); turns TLS on"),
    Variable("TEMPORAL_TLS", "off", "TLS with the system's roots"),
    Variable("TEMPORAL_TLS_CLIENT_CERT_PATH", "unset", "mTLS client certificate (PEM file)"),
    Variable("TEMPORAL_TLS_CLIENT_CERT_DATA", "unset", "or the certificate itself (PEM)"),
    Variable("TEMPORAL_TLS_CLIENT_KEY_PATH", "unset", "mTLS client key (PEM file)"),
    Variable("TEMPORAL_TLS_CLIENT_KEY_DATA", "unset", "or the key itself (PEM)"),
    Variable(
        "TEMPORAL_TLS_SERVER_CA_CERT_PATH", "unset", "CA to verify the server with (PEM file)"
    ),
    Variable("TEMPORAL_TLS_SERVER_CA_CERT_DATA", "unset", "or the CA itself (PEM)"),
    Variable("TEMPORAL_TLS_SERVER_NAME", "the address's host", "server name to verify"),
    Variable(
        "TEMPORAL_CONFIG_FILE",
        "`~/.config/temporalio/temporal.toml`",
        "a TOML file of profiles holding any of the above",
    ),
    Variable("TEMPORAL_PROFILE", "`default`", "the profile to read from that file"),
)
# Read by `durable_outbox_temporal/codec.py`, in every process that connects to Temporal.
PAYLOAD_VARIABLES = (
    Variable(
        "PAYLOAD_KEYS_FILE",
        "unset",
        "a file holding the `PAYLOAD_KEYS` list, read when `PAYLOAD_KEYS` is unset (`make dev`"
        " keeps its keys in `.data/payload-keys`)",
    ),
)
# Read by `durable_outbox_temporal/tracing.py`; the OpenTelemetry SDK reads the other standard
# `OTEL_*` ones.
TRACING_VARIABLES = (
    Variable(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "unset",
        "OTLP/HTTP collector; setting it (or the next one) turns tracing on",
    ),
    Variable("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "unset", "the same, for traces only"),
    Variable(
        "OTEL_TRACES_EXPORTER", "unset", "`otlp` or `console` turn tracing on; `none` keeps it off"
    ),
    Variable(
        "OTEL_SERVICE_NAME",
        "`durable-outbox-api`, `durable-outbox-worker`",
        "the service name spans carry",
    ),
)
CLI_VARIABLES = (
    Variable("OUTBOX_API_URL", "`http://127.0.0.1:8000`", "the API the CLI talks to (`--api`)"),
    Variable(
        "API_TOKEN", "unset", "the first of its tokens is sent as the bearer token (`--token`)"
    ),
)
DEV_VARIABLES = (
    Variable("DEV_TEMPORAL_PORT", "`7233`", "the Temporal dev server's gRPC port"),
    Variable("DEV_UI_PORT", "`8233`", "the Temporal Web UI's port"),
    Variable(
        "DEV_TEMPORAL_METRICS_PORT", "a free port", "the dev server's Prometheus `/metrics` port"
    ),
    Variable("DEV_FAKE_PORT", "`8025`", "the fake provider's port"),
    Variable("DEV_API_PORT", "`8000`", "the API's port"),
    Variable(
        "DEV_DATA_DIR",
        "`.data`",
        "where the stack keeps its items: the dev server's database, the read model, the"
        " development payload key",
    ),
    Variable("DEV_FAKE_REPORTS", "`1`", "`0`: the fake provider sends no delivery reports"),
    Variable(
        "DEV_FAKE_ARGS",
        "none",
        "extra fake provider flags (`--bounce-rate 0.2 --duplicate-reports`), which win over the"
        " stack's own",
    ),
    Variable(
        "FAKE_EMAIL_EVENTS_SECRET",
        "`dev-events-secret`",
        "the secret the fake's delivery reports carry to the API; every child gets it",
    ),
    Variable(
        "FAKE_ACS_ACCESS_KEY",
        "the shipped destinations' key",
        "the access key the fake provider checks ACS request signatures with",
    ),
    Variable(
        "FAKE_WEBHOOK_SECRET",
        "the shipped destinations' secret",
        "the secret the fake provider checks webhook signatures with",
    ),
    Variable(
        "FAKE_PAYMENT_TOKEN",
        "the shipped destination's token",
        "the bearer token the fake provider's payment API takes",
    ),
    Variable("NO_COLOR", "unset", "set: the stack's output is not coloured"),
)
EXAMPLE_VARIABLES = (
    Variable(
        "WEBHOOK_SECRET",
        "required",
        "the webhook destination's signing secret the receiver verifies with",
    ),
    Variable(
        "WEBHOOK_DB",
        "`webhooks.sqlite3`",
        "the receiver's SQLite database: the `webhook-id`s it has handled and its events",
    ),
)
BENCH_VARIABLES = (
    Variable("QUICK", "unset", "`1`: the short run of `make bench` and `make chaos`"),
    Variable(
        "BENCH_ONLY",
        "every scenario",
        "comma-separated scenario names `make bench` runs (`end to end,delivery latency`)",
    ),
    Variable(
        "BENCH_PROFILE",
        "unset",
        "`1`: a py-spy flame graph of the worker per scenario (`.bench/flame-*.svg`); `raw`:"
        " collapsed stacks",
    ),
    Variable(
        "ADAPTIVE_TRACE",
        "unset",
        "`1`: `bench.adaptive` prints each second's admitted and refused submits and the rate in"
        " force",
    ),
    Variable("CHAOS_MODE", "`item`", "`make chaos`: `item` or `bulk` destinations"),
    Variable(
        "READMODEL_POSTGRES_URL",
        "`postgresql+psycopg://postgres@127.0.0.1:5432/test`",
        "the PostgreSQL `bench.flow_ledger` and the read model's tests run on, and where"
        " `make bench` creates and drops the DBOS baseline's scratch system databases (and"
        " `bench.reshard` its read model's with `RESHARD_READ_MODEL=postgres`)",
    ),
    Variable("CHAOS_ITEMS", "`1000` (`200` with `QUICK=1`)", "`make chaos`: items to deliver"),
    Variable(
        "CHAOS_SEED", "random (printed)", "`make chaos`: the faults' and the kills' random seed"
    ),
    Variable(
        "CHAOS_DEADLINE_S",
        "`480` (`240` with `QUICK=1`)",
        "`make chaos`: items not final this long after their enqueue count as lost",
    ),
    Variable(
        "LANE_MODE",
        "both, `item` then `bulk`",
        "`bench.lane_scale`: `item` (the lane's own workflow) or `bulk` (a 4-shard destination)",
    ),
    Variable(
        "LANE_ITEMS", "`10000` (`1000` with `QUICK=1`)", "`bench.lane_scale`: items in the lane"
    ),
    Variable("LANE_APPENDERS", "`20`", "`bench.lane_scale`: concurrent appending clients"),
    Variable("LANE_STALL_S", "`120`", "`bench.lane_scale`: fail when no item ends for this long"),
    Variable(
        "LANE_SEED",
        "random (printed)",
        "`bench.lane_scale`: the fake's fault draws and the worker kills' random seed",
    ),
    Variable(
        "RESHARD_FROM",
        "`2`",
        "`bench.reshard`: the bulk destination's `shards` in the old generation (the worker and"
        " API the rollout replaces)",
    ),
    Variable("RESHARD_TO", "`4`", "`bench.reshard`: its `shards` in the new generation"),
    Variable(
        "RESHARD_PRODUCERS",
        "`12` (`6` with `QUICK=1`)",
        "`bench.reshard`: producers, each sending lanes one after another, each enqueue awaited",
    ),
    Variable("RESHARD_LANE_ITEMS", "`20`", "`bench.reshard`: items in each lane"),
    Variable(
        "RESHARD_STEP_ENQUEUES",
        "`300` (`100` with `QUICK=1`)",
        "`bench.reshard`: items enqueued before each step of the rollout",
    ),
    Variable("RESHARD_STALL_S", "`120`", "`bench.reshard`: fail when no item ends for this long"),
    Variable("RESHARD_SEED", "random (printed)", "`bench.reshard`: the fake's fault draws"),
    Variable(
        "RESHARD_READ_MODEL",
        "`sqlite`",
        "`bench.reshard`: `sqlite` (a file of the run's) or `postgres` (a scratch database on"
        " `READMODEL_POSTGRES_URL`'s server, dropped afterwards)",
    ),
    Variable("LOST_TASKS_ITEMS", "`500`", "`bench.lost_tasks`: items enqueued together each round"),
    Variable(
        "LOST_TASKS_ROUNDS",
        "`4`",
        "`bench.lost_tasks`: rounds, alternating without and with the heartbeat timeout",
    ),
    Variable(
        "AGGREGATE_COMMANDS",
        "`100000` (`10000` with `QUICK=1`)",
        "`bench.aggregate_scale`: commands sent to one aggregate",
    ),
    Variable(
        "LOAD_OUTBOXES",
        "`500` (`150` with `QUICK=1`)",
        "`bench.bounded_load`: outbox names it enqueues to",
    ),
    Variable(
        "LOAD_DEADLINE_S",
        "`300`",
        "`bench.bounded_load`: fail when the load is not done this long after it starts",
    ),
    Variable(
        "UPGRADE_POSTGRES_URL",
        "`postgresql+psycopg://postgres@127.0.0.1:5432/test`",
        "`bench.upgrade`: the PostgreSQL server it creates (and drops) its read model's"
        " database on",
    ),
    Variable(
        "UPGRADE_KEEP",
        "unset",
        "`bench.upgrade`: `1` keeps its working folder (the old release's tree, the dev server's"
        " database)",
    ),
    Variable("FAIRNESS_RATE", "`10`", "`bench.fairness`: the destination's submits per second"),
    Variable(
        "FAIRNESS_BACKLOG",
        "`300` (`150` with `QUICK=1`)",
        "`bench.fairness`: items the big outbox enqueues",
    ),
    Variable(
        "SHARD_KEYS",
        "`2000` (`400` with `QUICK=1`)",
        "`bench.shard_backlog`: ordering keys of 5 items each the one shard holds",
    ),
    Variable(
        "SHARD_RATE",
        "`50`",
        "`bench.shard_backlog`: the destination's submits per second (lower: a longer backlog)",
    ),
    Variable(
        "HOSTED_HOSTS",
        "`4`",
        "`bench.hosted_aggregates`: the prototype's host workflows for the flight type",
    ),
    Variable(
        "HOSTED_FLIGHTS",
        "`300`",
        "`bench.hosted_aggregates`: new flights each round opens and takes a seat in",
    ),
    Variable(
        "HOSTED_ROUNDS",
        "`2`",
        "`bench.hosted_aggregates`: rounds, each one with the prototype and one with a workflow"
        " per aggregate",
    ),
    Variable(
        "SLOW_RATE",
        "`10`",
        "`bench.hand_over_slow_queue`: the destination's submits per second (the shard has up to"
        " 100 out)",
    ),
    Variable(
        "SLOW_ITEMS",
        "`2000` (`600` with `QUICK=1`)",
        "`bench.hand_over_slow_queue`: items each round hands over to the one shard",
    ),
    Variable(
        "SLOW_SUGGEST_EVENTS",
        "`300`",
        "`bench.hand_over_slow_queue`: history events past which its dev server suggests"
        " continuing as new",
    ),
    Variable(
        "SLOW_ROUNDS",
        "`2`",
        "`bench.hand_over_slow_queue`: rounds, each one with the hand-over's grace and one"
        " waiting for everything out",
    ),
)


def configuration_page() -> str:
    """Every environment variable the code reads, and every field of the destinations file."""
    relative_config = SHIPPED_DESTINATIONS.relative_to(PROJECT_ROOT)
    lines = [
        "# Configuration reference",
        "",
        _generated_from(
            "`configuration/settings.py`, `durable_outbox_temporal/destinations.py`, the"
            " destinations file and the lists"
            " of other variables in `devstack/reference_docs.py`"
        ),
        "",
        "## Worker and API",
        "",
        "`Settings` (`configuration/settings.py`), read once at start from the environment or a"
        " `.env`"
        " file in the working directory; names are case-insensitive.",
        "",
        *_table(("Variable", "Type", "Default", "Meaning"), _settings_rows()),
        "",
        "## Temporal connection",
        "",
        "Temporal's own standard (`temporalio.envconfig`, as the `temporal` CLI and every SDK read"
        " it), for the worker, the API and `OutboxClient` alike"
        " (`durable_outbox_temporal.connect`).",
        "",
        *_variables_table(TEMPORAL_VARIABLES),
        "",
        "`TEMPORAL_GRPC_META_<NAME>` adds a gRPC header to every call. Refused at start-up, with"
        " the name to use instead: "
        + ", ".join(f"`{old}` (`{new}`)" for old, new in RETIRED_VARIABLES.items())
        + ".",
        "",
        "The payload codec (`durable_outbox_temporal/codec.py`) reads `PAYLOAD_KEYS` (above) in"
        " every process that"
        " connects to Temporal, or else:",
        "",
        *_variables_table(PAYLOAD_VARIABLES),
        "",
        "## Tracing",
        "",
        "Off unless one of these asks for it (`durable_outbox_temporal/tracing.py`); the"
        " OpenTelemetry SDK reads"
        " the other standard `OTEL_*` variables (headers, sampling, resource attributes).",
        "",
        *_variables_table(TRACING_VARIABLES),
        "",
        "## Destination overrides",
        "",
        "Any scalar field of a destination (below) can be overridden by"
        " `DEST_<NAME>_<FIELD>`, the name upper-cased with `-` as `_`"
        " (`DEST_FAKE_EMAIL_SUBMIT_RATE=3`), and a provider setting by"
        " `DEST_<NAME>_SETTINGS_<KEY>`. String values in the file may reference variables as"
        " `${NAME}` or `${NAME:-default}`; the shipped"
        f" [`{relative_config}`](../../{relative_config}) reads these:",
        "",
        *_table(("Variable", "Default", "Read for"), _shipped_references()),
        "",
        "## CLI",
        "",
        "`outbox` (`cli.py`; see [the CLI reference](cli.md)).",
        "",
        *_variables_table(CLI_VARIABLES),
        "",
        "## Dev stack",
        "",
        "`make dev` (`devstack/dev.py`) and the fake provider. The stack gives its children the"
        " matching `TEMPORAL_ADDRESS` and `FAKE_PROVIDER_URL`, a `DATABASE_URL` in the data"
        " directory and a development `PAYLOAD_KEYS` unless those two are set.",
        "",
        *_variables_table(DEV_VARIABLES),
        "",
        "## Examples",
        "",
        "The example webhook receiver (`examples/webhook_receiver/receiver.py`,"
        " [receive webhooks](../how-to/receive-webhooks.md)).",
        "",
        *_variables_table(EXAMPLE_VARIABLES),
        "",
        "## Benchmarks",
        "",
        "`make bench` (`bench/run.py`), `make chaos` (`bench/chaos.py`, `bench/lane_scale.py`)"
        " and `python -m bench.fairness`.",
        "",
        *_variables_table(BENCH_VARIABLES),
        "",
        "## Destination fields",
        "",
        "One `[destinations.<name>]` table per destination in the destinations file"
        " (`OUTBOX_CONFIG`), validated by `Destination`"
        " (`durable_outbox_temporal/destinations.py`). The delivery"
        " policy's fields sit in the same table; an item keeps the policy it was enqueued with.",
        "",
        *_table(("Field", "Type", "Default", "Meaning"), _destination_rows()),
        "",
        "### Flow control",
        "",
        "The `[destinations.<name>.flow]` table (`FlowPolicy`,"
        " `durable_outbox_temporal/contract/flow_policy.py`); every"
        " field has a default, so the table is optional.",
        "",
        *_table(("Field", "Type", "Default", "Meaning"), _model_rows(FlowPolicy)),
        "",
        "### Provider settings",
        "",
        "The `[destinations.<name>.settings]` table, by `provider`:",
        "",
        *_provider_sections(),
        "## Outbox fields",
        "",
        "Outboxes need no configuration; an `[outboxes.<name>]` table changes one outbox's"
        " ordering lanes (`OutboxSettings`).",
        "",
        *_table(("Field", "Type", "Default", "Meaning"), _model_rows(OutboxSettings)),
        "",
    ]
    return "\n".join(lines)


def _settings_rows() -> Iterator[tuple[str, ...]]:
    for name, field in Settings.model_fields.items():
        yield (
            f"`{name.upper()}`",
            _type_text(field.annotation, field.metadata),
            _default_text(field),
            _required_description(f"Settings.{name}", field.description),
        )


def _variables_table(variables: Iterable[Variable]) -> list[str]:
    rows = ((f"`{v.name}`", v.default, v.meaning) for v in variables)
    return _table(("Variable", "Default", "Meaning"), rows)


def _shipped_references() -> Iterator[tuple[str, ...]]:
    # The loader's own pattern, so the page reads references exactly as the loader does.
    seen: dict[str, tuple[str, set[str]]] = {}
    table = ""
    for line in SHIPPED_DESTINATIONS.read_text().splitlines():
        if line.startswith("["):
            table = line.strip()
        for match in _ENV_REFERENCE.finditer(line):
            name, default = match.group(1), match.group(2)
            where = f"`{table} {line.split('=', 1)[0].strip()}`"
            seen.setdefault(name, (f"`{default}`" if default else "required", set()))[1].add(where)
    for name, (default, places) in seen.items():
        yield f"`{name}`", default, ", ".join(sorted(places))


def _destination_rows() -> Iterator[tuple[str, ...]]:
    for name, field in Destination.model_fields.items():
        if name == "delivery":
            yield from _policy_rows()
            continue
        if name == "flow":
            continue  # a table of its own, below
        yield (
            f"`{name}`",
            _type_text(field.annotation, field.metadata),
            _default_text(field, toml=True),
            _required_description(f"Destination.{name}", field.description),
        )


def _policy_rows() -> Iterator[tuple[str, ...]]:
    hints = typing.get_type_hints(DeliveryPolicy, include_extras=True)
    fields = {field.name: field for field in dataclasses.fields(DeliveryPolicy)}
    for name in POLICY_SETTINGS:
        hint = hints[name]
        base, *metadata = typing.get_args(hint) if typing.get_origin(hint) else (hint,)
        yield (
            f"`{name}`",
            _type_text(base, metadata),
            _value_text(fields[name].default),
            _required_description(f"DeliveryPolicy.{name}", fields[name].metadata.get(DESCRIPTION)),
        )


def _provider_sections() -> Iterator[str]:
    for kind, model in PROVIDER_SETTINGS.items():
        yield f"`{kind}` ({_first_line(model.__doc__)})"
        yield ""
        yield from _table(("Setting", "Type", "Default", "Meaning"), _model_rows(model))
        yield ""


def _model_rows(model: type[BaseModel]) -> Iterator[tuple[str, ...]]:
    for name, field in model.model_fields.items():
        yield (
            f"`{name}`",
            _type_text(field.annotation, field.metadata),
            _default_text(field, toml=True),
            _required_description(f"{model.__name__}.{name}", field.description),
        )


def _required_description(where: str, description: str | None) -> str:
    if not description:
        raise ValueError(f"{where} has no description: add one in the code, not on the page")
    return description


def _type_text(annotation: Any, metadata: Iterable[Any] = ()) -> str:
    bounds = [_bound_text(item) for item in metadata]
    text = _hint_text(annotation)
    return ", ".join([text, *[bound for bound in bounds if bound]])


def _hint_text(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        return _hint_text(typing.get_args(hint)[0])
    if origin in (typing.Union, types.UnionType):
        kinds = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return " or ".join(_hint_text(kind) for kind in kinds)
    if origin is typing.Literal:
        return " or ".join(f'`"{value}"`' for value in typing.get_args(hint))
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return " or ".join(f'`"{member.value}"`' for member in hint)
    if origin is dict or hint is dict:
        return "table"
    names = {
        str: "string",
        int: "integer",
        float: "number",
        bool: "boolean",
        Path: "path",
        SecretStr: "string (secret)",
    }
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def _bound_text(item: Any) -> str:
    for kind, symbol in (
        (annotated_types.Gt, ">"),
        (annotated_types.Ge, "≥"),
        (annotated_types.Lt, "<"),
        (annotated_types.Le, "≤"),
    ):
        if isinstance(item, kind):
            value = next(iter(dataclasses.asdict(item).values()))
            return f"{symbol} {_number_text(value)}"
    if isinstance(item, annotated_types.MinLen):
        return f"at least {item.min_length} characters"
    return ""


def _default_text(field: FieldInfo, *, toml: bool = False) -> str:
    if field.default_factory is not None:
        return _value_text(field.default_factory(), toml=toml)  # type: ignore[call-arg]
    if field.default is PydanticUndefined:
        return "required"
    return _value_text(field.default, toml=toml)


def _value_text(value: Any, *, toml: bool = False) -> str:
    """A default as it is written: in the environment, or as a TOML value (`toml`)."""
    if value is None:
        return "unset"
    if isinstance(value, enum.Enum):
        value = value.value
    if toml and isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int | float):
        return f"`{_number_text(value)}`"
    if value in ("", {}):
        return "empty"
    text = str(value).replace(str(PROJECT_ROOT), "<project>")
    return f"`{text}`"


def _number_text(value: float) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def rest_api_page() -> str:
    """Every route of the API from its OpenAPI schema by tag, then the routes outside it."""
    app = create_app(Settings.model_construct())
    schema = app.openapi()
    by_tag: dict[str, list[tuple[str, ...]]] = {}
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            codes = sorted(operation["responses"])
            by_tag.setdefault(operation.get("tags", ["other"])[0], []).append(
                (
                    f"`{method.upper()}`",
                    f"`{path}`",
                    operation.get("summary", ""),
                    ", ".join(code for code in codes if code.startswith("2")),
                    _request_body(operation),
                    ", ".join(code for code in codes if code[0] in "45"),
                )
            )
    lines = [
        "# REST API reference",
        "",
        _generated_from("the app's OpenAPI schema (`api.main.create_app`)"),
        "",
        f"{schema['info']['summary']}. {schema['info']['description']}",
        "",
        "The running API serves the same schema at `/openapi.json`, and shows it as pages at"
        " `/docs` (Swagger UI) and `/redoc`.",
        "",
    ]
    columns = ("Method", "Path", "Summary", "Success", "Request body", "Errors")
    for tag, rows in by_tag.items():
        lines += [f"## {tag.capitalize()}", "", *_table(columns, rows), ""]
    lines += [
        "## Outside the schema",
        "",
        *_table(("Path", "Kind", "What"), _unlisted_routes(app.routes, app.openapi_url)),
        "",
    ]
    return "\n".join(lines)


def _request_body(operation: Mapping[str, Any]) -> str:
    content = operation.get("requestBody", {}).get("content", {})
    if not content:
        return "—"
    media, body = next(iter(content.items()))
    schema = body.get("schema", {})
    optional = ""
    choices = schema.get("anyOf", [])
    if {"type": "null"} in choices:
        (schema,) = [choice for choice in choices if choice != {"type": "null"}]
        optional = " (optional)"
    if "$ref" in schema:
        return f"`{_schema_name(schema)}`{optional}"
    if "$ref" in schema.get("items", {}):
        return f"array of `{_schema_name(schema['items'])}`{optional}"
    return f"{schema.get('type', 'any')} (`{media}`){optional}"


def _schema_name(schema: Mapping[str, Any]) -> str:
    return str(schema["$ref"]).rsplit("/", 1)[-1]


def _unlisted_routes(routes: Any, openapi_url: str | None) -> Iterator[tuple[str, ...]]:
    for context in iter_route_contexts(routes):
        route = context.route
        if isinstance(route, APIRoute) and route.include_in_schema:
            continue
        if isinstance(route, APIWebSocketRoute):
            kind = "WebSocket"
        elif isinstance(route, Mount):
            kind = "static files"
        elif context.path == openapi_url:
            yield f"`{context.path}`", "JSON", "this API's OpenAPI schema"
            continue
        else:
            kind = "page"
        endpoint = getattr(route, "endpoint", None)
        what = _first_line(endpoint.__doc__) if endpoint is not None else ""
        yield f"`{context.path}`", kind, what or str(context.name).replace("_", " ")


def cli_page() -> str:
    """Every command and option of `outbox`, from its argparse parser."""
    with _unset(("OUTBOX_API_URL", "API_TOKEN")):
        parser = cli.build_parser()
    lines = [
        "# CLI reference: `outbox`",
        "",
        _generated_from("the parser in `cli.py`"),
        "",
        "```text",
        (parser.description or "").strip(),
        "```",
        "",
        "## Global options",
        "",
        *_arguments_table(parser),
        "",
    ]
    lines += [
        "## Exit codes",
        "",
        "A failure prints one line on stderr (an API problem's title and detail), never a"
        " traceback.",
        "",
        *_table(
            ("Code", "Meaning"), ((f"`{int(code)}`", text) for code, text in cli.EXIT_CODES.items())
        ),
        "",
    ]
    for name, command, help_text in _commands(parser):
        lines += [f"## `outbox {name}`", "", f"{help_text[:1].upper()}{help_text[1:]}.", ""]
        lines += ["```text", _usage(command), "```", ""]
        if _own_arguments(command):
            lines += [*_arguments_table(command), ""]
    return "\n".join(lines)


@contextlib.contextmanager
def _unset(names: Iterable[str]) -> Iterator[None]:
    """The defaults the parser takes from the environment, as they are with none set."""
    saved = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _commands(
    parser: argparse.ArgumentParser, prefix: str = ""
) -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
        for name, command in action.choices.items():
            yield f"{prefix}{name}", command, helps[name]
            yield from _commands(command, f"{prefix}{name} ")


def _own_arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        action
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)
    ]


def _usage(parser: argparse.ArgumentParser) -> str:
    # One line whatever the terminal's width (the formatter otherwise reads COLUMNS).
    formatter = argparse.HelpFormatter(parser.prog, width=10_000)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip().removeprefix("usage: ")


def _arguments_table(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in _own_arguments(parser):
        # Our parser names no tuple metavars.
        metavar = str(action.metavar) if action.metavar else None
        if action.option_strings:
            name = ", ".join(action.option_strings)
            if action.nargs != 0:
                name += f" {metavar or action.dest.upper()}"
        else:
            name = metavar or action.dest
            if action.nargs == "?":
                name += " (optional)"
        meaning = _required_description(f"`{parser.prog}` argument `{name}`", action.help)
        details = []
        if action.choices:
            details.append("one of " + ", ".join(f"`{choice}`" for choice in action.choices))
        if (
            action.nargs != 0
            and action.default not in (None, False, argparse.SUPPRESS)
            and str(action.default) not in meaning  # the help says it already
        ):
            details.append(f"default `{action.default}`")
        if isinstance(action, argparse._AppendAction):
            details.append("repeatable")
        help_text = "; ".join([meaning, *details])
        rows.append((f"`{name}`", help_text))
    return _table(("Argument", "Meaning"), rows)


def metrics_page() -> str:
    """Every metric the API exports at `/metrics`, and where the worker's come from."""
    api_metrics = ApiMetrics()
    wrappers = [
        value for value in vars(api_metrics).values() if isinstance(value, MetricWrapperBase)
    ]
    rows = []
    for wrapper in wrappers:
        (described,) = wrapper.describe()
        rows.append(
            (
                f"`{_sample_name(described.name, described.type)}`",
                described.type,
                ", ".join(f"`{label}`" for label in wrapper._labelnames),
                described.documentation,
            )
        )
    for family in (*FAMILIES, *DESTINATION_FAMILIES):
        rows.append(
            (
                f"`{family.sample_name}`",
                family.kind,
                ", ".join(f"`{label}`" for label in family.labels),
                family.documentation,
            )
        )
    address = Settings.model_fields["worker_metrics_address"].default
    lines = [
        "# Metrics reference",
        "",
        _generated_from(
            "the metric definitions in `api/metrics.py`, `api/backlog_metrics.py` and"
            " `api/destination_metrics.py`"
        ),
        "",
        "## API",
        "",
        "`GET /metrics` on the API: with API tokens configured, a scrape needs a token with the"
        " `metrics` scope (unless `METRICS_TOKEN_REQUIRED=false`). The `outbox` label names the"
        " outboxes in `METRICS_OUTBOXES` and at most `METRICS_OUTBOX_LABELS` others (the most"
        " active); every other outbox counts as `other`. The backlog metrics are"
        " read from the read model at scrape time (at most once per `BACKLOG_METRICS_CACHE_S`);"
        " when that reading fails or is late, only `outbox_backlog_scrape_ok 0` is exported of"
        " them. The destinations' state is read from Temporal the same way"
        " (`outbox_destinations_scrape_ok`). A histogram's samples are `_bucket`, `_sum` and"
        " `_count`.",
        "",
        *_table(("Metric", "Type", "Labels", "Meaning"), rows),
        "",
        "## Worker",
        "",
        f"The worker serves the Temporal SDK's own metrics at `WORKER_METRICS_ADDRESS`"
        f" (`{address}`, path `/metrics`; empty turns them off): task and poll latencies, slots,"
        " sticky cache, activity and workflow outcomes, all prefixed `temporal_`. See"
        " [Temporal's SDK metrics reference](https://docs.temporal.io/references/sdk-metrics)."
        " Beside them, the aggregate workflow's own counters, through the SDK's metric meter (a"
        " replayed task counts nothing again), each with the SDK's `namespace`, `task_queue` and"
        " `workflow_type` labels:",
        "",
        *_table(
            ("Metric", "Type", "Labels", "Meaning"),
            [
                (f"`{RUNS_ENDED_METRIC[0]}`", "counter", "`aggregate_type`", RUNS_ENDED_METRIC[1]),
                (
                    f"`{RUNS_RESUMED_METRIC[0]}`",
                    "counter",
                    "`aggregate_type`, `source`",
                    RUNS_RESUMED_METRIC[1],
                ),
            ],
        ),
        "",
    ]
    return "\n".join(lines)


def problems_page() -> str:
    """Every problem `code` the API answers with, each with its status, meaning and remedy."""
    lines = [
        "# Problem codes",
        "",
        _generated_from("the table in `api/problem_codes.py`"),
        "",
        "Every error the API answers is RFC 9457 `application/problem+json`: `type`, `code`,"
        " `title`, `status`, `detail`, and `instance` (the request's path), plus members of its"
        " own where a problem has them (`errors` per invalid field, `redrive`, `missing_scope`,"
        " `actor`). `code` is stable: script against it, not against `title` or `detail`."
        " `type` is the URI of the code's page, which the API serves at `/problems/<code>`"
        " (all of them: `/problems`); it is relative unless `PUBLIC_BASE_URL` is set. The same"
        " code always comes with the same status.",
        "",
    ]
    for section, problems in SECTIONS.items():
        lines += [f"## {section}", ""]
        if section == "Aggregates' own refusals":
            lines += [
                "A command an aggregate's definition refuses with an error class of its own"
                " answers with that class's code (its name in kebab case); a refusal without"
                " one is `command-conflict` (409) or `invalid-command` (422). Such a code (and"
                " `version-conflict`) refines a broader one, whose `type` the answer keeps.",
                "",
            ]
        lines += _table(
            ("Code", "Status", "Meaning"),
            ((f"[`{p.code}`](#{p.code})", str(p.status or "any"), p.meaning) for p in problems),
        )
        lines.append("")
        for problem in problems:
            answers = f"Status {problem.status or 'any'}."
            if problem.refines:
                answers += f" Its `type` is `/problems/{problem.refines}`."
            lines += [
                f"### `{problem.code}`",
                "",
                f"{answers} {problem.meaning}",
                "",
                f"What to do: {problem.remedy}",
                "",
            ]
    return "\n".join(lines)


def retry_schedule_page() -> str:
    """When a failing item's submits go, and when it fails, under the default delivery policy."""
    policy = DeliveryPolicy(destination="", submit_task_queue="", poll_task_queue="")
    jitter = 1 + policy.backoff_jitter
    rows = []
    earliest = latest = 0.0
    for attempt in range(1, policy.max_attempts + 1):
        if attempt > 1:
            wait = policy.backoff_s(attempt - 1)
            earliest, latest = earliest + wait, latest + wait * jitter
            waited = f"{wait:g}–{wait * jitter:g} s"
        else:
            waited = "—"
        rows.append((str(attempt), waited, f"{_duration(earliest)}–{_duration(latest)}"))
    return "\n".join(
        [
            "# Retry schedule",
            "",
            _generated_from(
                "`DeliveryPolicy`'s defaults (`durable_outbox_temporal/contract/item.py`)"
            ),
            "",
            "An item whose submits fail with a retryable error (5xx, a timeout, a connection error)"
            f" tries {policy.max_attempts} times (`max_attempts`), waiting"
            f" `backoff_initial_s` ({policy.backoff_initial_s:g} s) times `backoff_multiplier`"
            f" ({policy.backoff_multiplier:g}) per attempt, at most `backoff_max_s`"
            f" ({policy.backoff_max_s:g} s), plus up to `backoff_jitter`"
            f" ({policy.backoff_jitter:.0%}) more at random. A `Retry-After` from the provider"
            " replaces the wait. Each attempt also takes its request's own time (at most"
            f" `submit_timeout_s`, {policy.submit_timeout_s:g} s), not counted below. An item"
            " waiting on flow control (a pause, a throttle, an open circuit, a cap) spends no"
            " attempt.",
            "",
            *_table(("attempt", "waits before it", "starts after the first, at"), rows),
            "",
            f"After attempt {policy.max_attempts} fails, the item ends `failed` (a dead letter),"
            f" {_duration(earliest)} to {_duration(latest)} after its first attempt with the"
            " defaults. Each destination sets its own (`[destinations.<name>]` in the"
            " [configuration](configuration.md)).",
            "",
        ]
    )


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def _sample_name(name: str, kind: str) -> str:
    return f"{name}_total" if kind == "counter" else name


def _generated_from(sources: str) -> str:
    return (
        f"Generated from {sources} by `{COMMAND}`; edit those, not this page (a test fails when"
        " it is stale)."
    )


def _first_line(text: str | None) -> str:
    return (text or "").strip().split("\n\n")[0].replace("\n", " ").rstrip(".")


def _table(columns: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> list[str]:
    return [
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows),
    ]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|") or "—"


PAGES: dict[str, Callable[[], str]] = {
    "configuration.md": configuration_page,
    "rest-api.md": rest_api_page,
    "contract.md": contract_page,
    "cli.md": cli_page,
    "metrics.md": metrics_page,
    "problems.md": problems_page,
    "retry-schedule.md": retry_schedule_page,
}


def stale_pages(directory: Path = REFERENCE_DIR) -> list[str]:
    """The pages whose file differs from what the code generates now."""
    stale = []
    for name, generate in PAGES.items():
        path = directory / name
        if not path.exists() or path.read_text() != generate():
            stale.append(name)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if a page is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages()
        for name in stale:
            print(f"docs/reference/{name} is stale: run {COMMAND}")
        return 1 if stale else 0
    REFERENCE_DIR.mkdir(parents=True, exist_ok=True)
    for name, generate in PAGES.items():
        (REFERENCE_DIR / name).write_text(generate())
    return 0


if __name__ == "__main__":
    sys.exit(main())
