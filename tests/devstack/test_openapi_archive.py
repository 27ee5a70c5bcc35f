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
        },
        "components": {
            "schemas": {
                "New": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "maxLength": 100},
                        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                        "count": {"type": "integer", "minimum": 0},
                    },
                    "required": ["name"],
                },
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
