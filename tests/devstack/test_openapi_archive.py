"""The API only grows: HEAD's OpenAPI document keeps everything each archived release's offers,
and the comparer finds each kind of loss on small documents."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from configuration.version import VERSION
from devstack.archive import check, read_manifest
from devstack.openapi_archive import (
    ARCHIVE,
    archived_documents,
    breaking_changes,
    current_document,
)


def _document() -> dict[str, Any]:
    return {
        "paths": {
            "/v1/things": {
                "post": {
                    "parameters": [
                        {"in": "query", "name": "dry_run", "schema": {"type": "boolean"}}
                    ],
                    "requestBody": {
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/New"}}
                        }
                    },
                },
                "get": {"parameters": []},
            },
            "/v1/things/{id}": {"get": {}},
            "/v1/things:batch": {
                "post": {
                    "requestBody": {
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/Batch"}}
                        }
                    }
                }
            },
            # Inline request bodies, as FastAPI writes a free-form one and an optional model.
            "/v1/things/{id}/commands": {
                "post": {
                    "requestBody": {
                        "content": {
                            "application/json": {
                                "schema": {"type": "object", "additionalProperties": True}
                            }
                        }
                    }
                }
            },
            "/v1/things/{id}/cancel": {
                "post": {
                    "requestBody": {
                        "content": {
                            "application/json": {
                                "schema": {
                                    "anyOf": [
                                        {"$ref": "#/components/schemas/Cancel"},
                                        {"type": "null"},
                                    ]
                                }
                            }
                        }
                    }
                }
            },
        },
        "components": {
            "schemas": {
                "New": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "maxLength": 100},
                        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                        "count": {"type": "integer", "minimum": 0},
                        # Optional values as pydantic writes them: the bounds in the union.
                        "mode": {
                            "anyOf": [
                                {"type": "string", "enum": ["latest", "collect"]},
                                {"type": "null"},
                            ]
                        },
                        "key": {
                            "anyOf": [
                                {"type": "string", "minLength": 1, "maxLength": 200},
                                {"type": "null"},
                            ]
                        },
                        "delay": {
                            "anyOf": [
                                {"type": "number", "minimum": 0, "maximum": 3600},
                                {"type": "null"},
                            ]
                        },
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    },
                    "required": ["name"],
                },
                "Batch": {
                    "type": "object",
                    "properties": {
                        "items": {
                            "type": "array",
                            "maxItems": 100,
                            "items": {
                                "type": "object",
                                "properties": {
                                    "destination": {"type": "string"},
                                    "payload": {"type": "object"},
                                    "subject": {
                                        "anyOf": [
                                            {"type": "string", "maxLength": 320},
                                            {"type": "null"},
                                        ]
                                    },
                                },
                                "required": ["destination", "payload"],
                            },
                        }
                    },
                    "required": ["items"],
                },
                "Cancel": {"type": "object", "properties": {"reason": {"type": "string"}}},
                "Thing": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string"},
                        "status": {"type": "string", "enum": ["queued", "sent", "failed"]},
                    },
                    "required": ["id", "status"],
                },
            }
        },
    }


def _changed(edit: Any) -> list[str]:
    new = copy.deepcopy(_document())
    edit(new)
    return breaking_changes(_document(), new)


def _schema(document: dict[str, Any], name: str) -> dict[str, Any]:
    return document["components"]["schemas"][name]


def _field(document: dict[str, Any], name: str, field: str) -> dict[str, Any]:
    """A field's schema; for an optional one, the branch that is not null."""
    schema: dict[str, Any] = _schema(document, name)["properties"][field]
    return schema["anyOf"][0] if "anyOf" in schema else schema


def _element(document: dict[str, Any]) -> dict[str, Any]:
    """The schema of one element of `Batch.items`."""
    return _schema(document, "Batch")["properties"]["items"]["items"]


def _body(document: dict[str, Any], path: str) -> dict[str, Any]:
    body: dict[str, Any] = document["paths"][path]["post"]["requestBody"]
    return body["content"]["application/json"]["schema"]


def test_a_document_that_only_grew_breaks_nothing() -> None:
    def grow(doc: dict[str, Any]) -> None:
        doc["paths"]["/v1/other"] = {"get": {}}
        doc["paths"]["/v1/things/{id}"]["delete"] = {}
        _schema(doc, "New")["properties"]["extra"] = {"type": "string"}
        _schema(doc, "New")["properties"]["name"]["maxLength"] = 200
        _schema(doc, "Thing")["properties"]["status"]["enum"].append("cancelled")
        _schema(doc, "Thing")["properties"]["added"] = {"type": "string"}
        _schema(doc, "Thing")["required"].append("added")  # a response may promise more
        _schema(doc, "New")["properties"]["count"] = {"type": "number", "minimum": 0}
        _field(doc, "New", "mode")["enum"].append("first")
        _field(doc, "New", "key").update(minLength=0, maxLength=400)
        _field(doc, "New", "delay").pop("maximum")
        _schema(doc, "New")["properties"]["note"]["anyOf"].append({"type": "integer"})
        _element(doc)["properties"]["priority"] = {"type": "integer"}
        _element(doc)["properties"]["subject"]["anyOf"][0]["maxLength"] = 500
        _schema(doc, "Batch")["properties"]["items"]["maxItems"] = 1000
        _body(doc, "/v1/things/{id}/cancel")["anyOf"].append({"type": "string"})
        _schema(doc, "Cancel")["properties"]["note"] = {"type": "string"}

    assert _changed(grow) == []


@pytest.mark.parametrize(
    "edit, found",
    [
        (lambda d: d["paths"].pop("/v1/things/{id}"), "path removed: /v1/things/{id}"),
        (lambda d: d["paths"]["/v1/things"].pop("get"), "operation removed: GET /v1/things"),
        (
            lambda d: d["paths"]["/v1/things"]["post"]["parameters"].clear(),
            "parameter removed: POST /v1/things parameter dry_run",
        ),
        (
            lambda d: d["paths"]["/v1/things"]["post"]["parameters"][0].update(required=True),
            "newly required: POST /v1/things parameter dry_run",
        ),
        (lambda d: _schema(d, "Thing")["properties"].pop("id"), "field removed: schema Thing.id"),
        (
            lambda d: _schema(d, "Thing")["properties"]["status"]["enum"].remove("failed"),
            "enum value removed: schema Thing.status: failed",
        ),
        (
            lambda d: _schema(d, "New")["required"].append("note"),
            "newly required: schema New.note",
        ),
        (
            lambda d: _schema(d, "New")["properties"].update(note={"type": "string"}),
            "type narrowed: schema New.note no longer takes null",
        ),
        (
            lambda d: _schema(d, "New")["properties"]["name"].update(maxLength=50),
            "type narrowed: schema New.name maxLength 100 -> 50",
        ),
        (
            lambda d: _schema(d, "New")["properties"]["count"].update(minimum=1),
            "type narrowed: schema New.count minimum 0 -> 1",
        ),
        (
            lambda d: _schema(d, "New")["properties"].update(count={"type": "string"}),
            "type narrowed: schema New.count no longer takes integer",
        ),
        (lambda d: d["components"]["schemas"].pop("Thing"), "schema removed: Thing"),
        # Inside a union (an optional field's non-null branch).
        (
            lambda d: _field(d, "New", "mode")["enum"].remove("collect"),
            "enum value removed: schema New.mode: collect",
        ),
        (
            lambda d: _field(d, "New", "key").update(maxLength=50),
            "type narrowed: schema New.key maxLength 200 -> 50",
        ),
        (
            lambda d: _field(d, "New", "key").update(minLength=2),
            "type narrowed: schema New.key minLength 1 -> 2",
        ),
        (
            lambda d: _field(d, "New", "delay").update(maximum=60),
            "type narrowed: schema New.delay maximum 3600 -> 60",
        ),
        (
            lambda d: _field(d, "New", "delay").update(minimum=1),
            "type narrowed: schema New.delay minimum 0 -> 1",
        ),
        (
            lambda d: _field(d, "New", "key").update(pattern="^[a-z]+$"),
            "type narrowed: schema New.key pattern none -> ^[a-z]+$",
        ),
        (
            lambda d: _field(d, "New", "delay").update(type="integer"),
            "type narrowed: schema New.delay no longer takes number",
        ),
        (
            lambda d: _schema(d, "New")["properties"]["key"]["anyOf"].pop(1),
            "type narrowed: schema New.key no longer takes null",
        ),
        # An object's other properties.
        (
            lambda d: _schema(d, "New")["properties"]["labels"].update(
                additionalProperties={"type": "string", "maxLength": 10}
            ),
            "type narrowed: schema New.labels.* maxLength none -> 10",
        ),
        (
            lambda d: _schema(d, "New")["properties"]["labels"].update(additionalProperties=False),
            "type narrowed: schema New.labels no longer takes other properties",
        ),
        # The elements of an array.
        (
            lambda d: _element(d)["properties"].pop("subject"),
            "field removed: schema Batch.items[].subject",
        ),
        (
            lambda d: _element(d)["required"].append("subject"),
            "newly required: schema Batch.items[].subject",
        ),
        (
            lambda d: _element(d)["properties"]["subject"]["anyOf"][0].update(maxLength=100),
            "type narrowed: schema Batch.items[].subject maxLength 320 -> 100",
        ),
        (
            lambda d: _schema(d, "Batch")["properties"]["items"].update(maxItems=10),
            "type narrowed: schema Batch.items maxItems 100 -> 10",
        ),
        # Request bodies written inline.
        (
            lambda d: _body(d, "/v1/things/{id}/commands").update(additionalProperties=False),
            "type narrowed: POST /v1/things/{id}/commands request body no longer takes other"
            " properties",
        ),
        (
            lambda d: _body(d, "/v1/things/{id}/commands").update(
                properties={"actor": {"type": "string"}}, required=["actor"]
            ),
            "newly required: POST /v1/things/{id}/commands request body.actor",
        ),
        (
            lambda d: _body(d, "/v1/things/{id}/cancel")["anyOf"].pop(1),
            "type narrowed: POST /v1/things/{id}/cancel request body no longer takes null",
        ),
        (
            lambda d: d["paths"]["/v1/things/{id}/cancel"]["post"]["requestBody"]["content"].update(
                {"application/json": {"schema": {"type": "object"}}}
            ),
            "type narrowed: POST /v1/things/{id}/cancel request body no longer takes Cancel, null",
        ),
        (
            lambda d: d["paths"]["/v1/things/{id}/commands"]["post"]["requestBody"]["content"].pop(
                "application/json"
            ),
            "request body type removed: POST /v1/things/{id}/commands application/json",
        ),
        # A schema a request reaches only through an inline body's union is a request's too.
        (
            lambda d: _schema(d, "Cancel").update(required=["reason"]),
            "newly required: schema Cancel.reason",
        ),
    ],
)
def test_each_loss_is_found(edit: Any, found: str) -> None:
    assert found in _changed(edit)


def test_heads_document_keeps_every_archived_releases() -> None:
    documents = archived_documents()
    assert {"0.1.0", VERSION} <= set(documents)
    current = current_document()
    for version, document in documents.items():
        assert breaking_changes(document, current) == [], f"HEAD breaks the API of {version}"


def test_the_archived_documents_are_sealed_and_unchanged() -> None:
    assert not check(ARCHIVE)
    assert {path.name for path in ARCHIVE.glob("*.json")} == set(read_manifest(ARCHIVE))
