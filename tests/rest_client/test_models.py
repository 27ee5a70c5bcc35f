"""The REST client's models stay in step with the API: each has the fields of the app's OpenAPI
schema for its body, required alike and of the same JSON types, and keeps unknown fields."""

from __future__ import annotations

from typing import Any

import durable_outbox_rest
import pytest
from pydantic import BaseModel

from api.main import create_app
from configuration.settings import Settings

# Each client model and the schema it mirrors in the app's OpenAPI components.
MIRRORS: dict[type[BaseModel], str] = {
    durable_outbox_rest.NewItem: "BatchEnqueueItem",
    durable_outbox_rest.Problem: "Problem",
    durable_outbox_rest.ItemLinks: "ItemLinks",
    durable_outbox_rest.Enqueued: "EnqueueResponse",
    durable_outbox_rest.BatchResult: "BatchResult",
    durable_outbox_rest.BatchEnqueued: "BatchEnqueueResponse",
    durable_outbox_rest.Recipient: "Recipient",
    durable_outbox_rest.WaitingOn: "WaitingOn",
    durable_outbox_rest.Item: "ItemResponse",
    durable_outbox_rest.ItemPage: "ItemPage",
    durable_outbox_rest.CancelRequested: "CancelRequestedResponse",
    durable_outbox_rest.ItemEvent: "EventRecord",
    durable_outbox_rest.DeadLetter: "DeadLetterResponse",
    durable_outbox_rest.DeadLetterPage: "DeadLetterPage",
    durable_outbox_rest.RedriveBatch: "RedriveBatchResponse",
    durable_outbox_rest.QueueRate: "QueueRateInfo",
    durable_outbox_rest.FlowEvent: "FlowEventInfo",
    durable_outbox_rest.Flow: "FlowInfo",
    durable_outbox_rest.Adaptive: "AdaptiveInfo",
    durable_outbox_rest.RatePoint: "RatePointInfo",
    durable_outbox_rest.FlowPolicyField: "FlowPolicyField",
    durable_outbox_rest.Destination: "DestinationInfoFull",
    durable_outbox_rest.Lane: "LaneResponse",
    durable_outbox_rest.LanePage: "LanePage",
    durable_outbox_rest.RecordedEvent: "RecordedEvent",
    durable_outbox_rest.CommandResult: "CommandResult",
    durable_outbox_rest.AggregateView: "AggregateView",
}
CLIENT_TO_API = {model.__name__: name for model, name in MIRRORS.items()}


@pytest.fixture(scope="module")
def api_schemas() -> dict[str, Any]:
    components: dict[str, Any] = dict(
        create_app(Settings.model_construct()).openapi()["components"]["schemas"]
    )
    # A batch item's schema is inlined in the batch's (each item is validated on its own).
    components["BatchEnqueueItem"] = components["BatchEnqueueRequest"]["properties"]["items"][
        "items"
    ]
    return components


def shape(schema: dict[str, Any], schemas: dict[str, Any], names: dict[str, str]) -> Any:
    """A field's JSON type, comparable across the two schemas (None: the schema says nothing);
    an enum is a string, since the client keeps open vocabularies as text."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        target = schemas[name]
        if "enum" in target:
            return target.get("type", "string")
        return ("model", names.get(name, name))
    if "anyOf" in schema:
        return frozenset(shape(option, schemas, names) for option in schema["anyOf"])
    if "enum" in schema or "const" in schema:
        return schema.get("type", "string")
    kind = schema.get("type")
    if kind == "array":
        return ("array", shape(schema.get("items", {}), schemas, names))
    if kind == "object":
        values = schema.get("additionalProperties")
        return ("object", shape(values, schemas, names) if isinstance(values, dict) else None)
    if kind == "string" and schema.get("format") == "date-time":
        return "date-time"
    return kind


def fields(schema: dict[str, Any]) -> tuple[set[str], set[str]]:
    return set(schema.get("properties", {})), set(schema.get("required", []))


def test_every_client_model_mirrors_an_api_schema() -> None:
    exported = {
        value
        for value in vars(durable_outbox_rest).values()
        if isinstance(value, type) and issubclass(value, BaseModel)
    }

    assert exported == set(MIRRORS)


@pytest.mark.parametrize("model", list(MIRRORS), ids=lambda model: model.__name__)
def test_client_model_has_the_api_fields_required_alike_and_typed_alike(
    model: type[BaseModel], api_schemas: dict[str, Any]
) -> None:
    api = api_schemas[MIRRORS[model]]
    client = model.model_json_schema()
    client_schemas = client.get("$defs", {})

    api_fields, api_required = fields(api)
    client_fields, client_required = fields(client)
    assert client_fields == api_fields, (
        f"only in the API: {sorted(api_fields - client_fields)};"
        f" only in the client: {sorted(client_fields - api_fields)}"
    )
    assert client_required == api_required
    for name in sorted(api_fields):
        api_shape = shape(api["properties"][name], api_schemas, {})
        if api_shape is None:
            continue  # typed `Any` in the API: the client may say more
        client_shape = shape(client["properties"][name], client_schemas, CLIENT_TO_API)
        assert client_shape == api_shape, name


@pytest.mark.parametrize(
    "model",
    [model for model in MIRRORS if model is not durable_outbox_rest.NewItem],
    ids=lambda model: model.__name__,
)
def test_response_models_keep_fields_a_newer_api_adds(model: type[BaseModel]) -> None:
    assert model.model_config.get("extra") == "allow"


def test_the_shape_of_a_field_tells_its_types_apart() -> None:
    schemas = {"Status": {"enum": ["a"], "type": "string"}, "Links": {"type": "object"}}

    def of(schema: dict[str, Any]) -> Any:
        return shape(schema, schemas, {})

    assert of({"$ref": "#/components/schemas/Status"}) == of({"type": "string"}) == "string"
    assert of({"$ref": "#/components/schemas/Links"}) == ("model", "Links")
    assert of({"type": "string", "format": "date-time"}) != of({"type": "string"})
    assert of({"anyOf": [{"type": "integer"}, {"type": "null"}]}) != of({"type": "integer"})
    assert of({"type": "array", "items": {"type": "string"}}) != of(
        {"type": "array", "items": {"type": "integer"}}
    )
    assert of({}) is None
