"""The API only grows: each release's OpenAPI document is committed under
`docs/reference/openapi/<version>.json` (sealed by `SHA256SUMS`, never rewritten), and HEAD's
document must keep everything every archived one offers a client.

`breaking_changes(old, new)` lists what a client of `old` would lose with `new`: a removed path,
operation, parameter, schema, field or enum value; a field or parameter a request must now send;
a narrowed type (a type dropped from a union, a tighter length or range bound, a new or changed
pattern, other properties refused). It looks into every branch of a union (`anyOf`, `oneOf`),
the elements of an array, an object's other properties and the request bodies written inline.

    python -m devstack.openapi_archive write   # write this release's document (at release time)
    python -m devstack.openapi_archive check   # exit 1 if HEAD breaks an archived document
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from api.main import create_app
from configuration.settings import PROJECT_ROOT, Settings
from configuration.version import VERSION
from devstack.archive import seal

ARCHIVE = PROJECT_ROOT / "docs" / "reference" / "openapi"
METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")
# A bound that, made smaller (upper) or larger (lower), refuses values it took before.
UPPER_BOUNDS = ("maxLength", "maxItems", "maximum", "exclusiveMaximum", "maxProperties")
LOWER_BOUNDS = ("minLength", "minItems", "minimum", "exclusiveMinimum", "minProperties")
# The keywords that describe a value without constraining it.
ANNOTATIONS = {"title", "description", "default", "examples", "example", "deprecated"}

Schema = Mapping[str, Any]


def current_document() -> dict[str, Any]:
    """HEAD's OpenAPI document, from the app with the default settings."""
    return create_app(Settings(_env_file=None)).openapi()  # type: ignore[call-arg]


def archived_documents(archive: Path = ARCHIVE) -> dict[str, dict[str, Any]]:
    """Each archived release's document, by version."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(archive.glob("*.json"))}


def breaking_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What a client written against `old` loses with `new`; empty when `new` only grew."""
    # A loss met twice (a union's type at its level and in its branch) is told once.
    return list(dict.fromkeys(_Comparison(old, new).run()))


class _Comparison:
    def __init__(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        self.old, self.new = old, new
        self.old_schemas: Mapping[str, Schema] = old.get("components", {}).get("schemas", {})
        self.new_schemas: Mapping[str, Schema] = new.get("components", {}).get("schemas", {})
        self.requests = _request_schemas(old)

    def run(self) -> Iterator[str]:
        new_paths = self.new.get("paths", {})
        for path, operations in self.old.get("paths", {}).items():
            if path not in new_paths:
                yield f"path removed: {path}"
                continue
            for method in METHODS:
                if method not in operations:
                    continue
                where = f"{method.upper()} {path}"
                if method not in new_paths[path]:
                    yield f"operation removed: {where}"
                    continue
                yield from self._operation(where, operations[method], new_paths[path][method])
        for name, schema in self.old_schemas.items():
            if name not in self.new_schemas:
                yield f"schema removed: {name}"
                continue
            yield from self._schema(
                f"schema {name}", schema, self.new_schemas[name], request=name in self.requests
            )

    def _operation(self, where: str, old: Schema, new: Schema) -> Iterator[str]:
        new_parameters = {(p["in"], p["name"]): p for p in new.get("parameters", [])}
        old_keys = set()
        for parameter in old.get("parameters", []):
            key = (parameter["in"], parameter["name"])
            old_keys.add(key)
            named = f"{where} parameter {parameter['name']}"
            if key not in new_parameters:
                yield f"parameter removed: {named}"
                continue
            if new_parameters[key].get("required") and not parameter.get("required"):
                yield f"newly required: {named}"
            yield from self._schema(
                named, parameter.get("schema", {}), new_parameters[key].get("schema", {}), True
            )
        for key, parameter in new_parameters.items():
            if key not in old_keys and parameter.get("required"):
                yield f"newly required: {where} parameter {parameter['name']}"
        old_body, new_body = old.get("requestBody") or {}, new.get("requestBody") or {}
        if new_body.get("required") and not old_body.get("required"):
            yield f"newly required: {where} request body"
        new_media = new_body.get("content", {})
        for media_type, media in old_body.get("content", {}).items():
            if media_type not in new_media:
                yield f"request body type removed: {where} {media_type}"
                continue
            yield from self._part(
                f"{where} request body",
                media.get("schema", {}),
                new_media[media_type].get("schema", {}),
                request=True,
            )

    def _schema(self, where: str, old: Schema, new: Schema, request: bool) -> Iterator[str]:
        lost_types = _types(old) - _types(new)
        if _types(new) and lost_types:
            yield f"type narrowed: {where} no longer takes {', '.join(sorted(lost_types))}"
        if _branches(old) is not None or _branches(new) is not None:
            # A union: each branch of the old is held to its counterpart in the new.
            candidates = _branches(new) or [new]
            for branch in _branches(old) or [old]:
                counterpart = _counterpart(branch, candidates)
                if counterpart is not None:
                    yield from self._part(where, branch, counterpart, request)
            return
        resolved_old, resolved_new = self._resolve(old), self._resolve(new)
        if _branches(resolved_old) is not None or _branches(resolved_new) is not None:
            yield from self._schema(where, resolved_old, resolved_new, request)  # a named union
            return
        yield from self._shape(where, resolved_old, resolved_new, request)

    def _shape(self, where: str, old: Schema, new: Schema, request: bool) -> Iterator[str]:
        """Two schemas that are not unions: their values, bounds, fields and elements."""
        if request and not _types(old) and _types(new) and _any_type(old):
            yield f"type narrowed: {where} took any type, now {', '.join(sorted(_types(new)))}"
        if "enum" in old:
            lost = [value for value in old["enum"] if value not in new.get("enum", old["enum"])]
            if lost:
                yield f"enum value removed: {where}: {', '.join(map(str, lost))}"
        if request:
            yield from _narrowed_bounds(where, old, new)
        old_properties, new_properties = old.get("properties", {}), new.get("properties", {})
        for name, schema in old_properties.items():
            if name not in new_properties:
                yield f"field removed: {where}.{name}"
            else:
                yield from self._part(f"{where}.{name}", schema, new_properties[name], request)
        if request:
            for name in sorted(set(new.get("required", [])) - set(old.get("required", []))):
                yield f"newly required: {where}.{name}"
        if isinstance(old.get("items"), Mapping) and isinstance(new.get("items"), Mapping):
            yield from self._part(f"{where}[]", old["items"], new["items"], request)
        yield from self._additional_properties(where, old, new, request)

    def _additional_properties(
        self, where: str, old: Schema, new: Schema, request: bool
    ) -> Iterator[str]:
        """The properties an object takes beyond those it names: absent or true, any; false,
        none; a schema, those it allows."""
        old_extra, new_extra = (
            old.get("additionalProperties", True),
            new.get("additionalProperties", True),
        )
        if request and old_extra is not False and new_extra is False:
            yield f"type narrowed: {where} no longer takes other properties"
        elif isinstance(old_extra, Mapping) and isinstance(new_extra, Mapping):
            yield from self._part(f"{where}.*", old_extra, new_extra, request)
        elif request and old_extra is True and isinstance(new_extra, Mapping):
            yield from self._part(f"{where}.*", {}, new_extra, request)

    def _part(self, where: str, old: Schema, new: Schema, request: bool) -> Iterator[str]:
        """A schema within another: one named in both is compared once, under its own name."""
        if "$ref" in old and old.get("$ref") == new.get("$ref"):
            return
        yield from self._schema(where, old, new, request)

    def _resolve(self, schema: Schema) -> Schema:
        ref = schema.get("$ref")
        if ref is None:
            return schema
        name = ref.rsplit("/", 1)[-1]
        return self.old_schemas.get(name) or self.new_schemas.get(name) or {}


def _narrowed_bounds(where: str, old: Schema, new: Schema) -> Iterator[str]:
    """The bounds and pattern of a request's value that now refuse values they took."""
    for bound in UPPER_BOUNDS:
        if bound in new and (bound not in old or new[bound] < old[bound]):
            yield f"type narrowed: {where} {bound} {old.get(bound, 'none')} -> {new[bound]}"
    for bound in LOWER_BOUNDS:
        if bound in new and (bound not in old or new[bound] > old[bound]):
            yield f"type narrowed: {where} {bound} {old.get(bound, 'none')} -> {new[bound]}"
    if "pattern" in new and new["pattern"] != old.get("pattern"):
        # Whether a changed pattern takes every value the old one did cannot be told here.
        yield f"type narrowed: {where} pattern {old.get('pattern', 'none')} -> {new['pattern']}"


def _branches(schema: Schema) -> list[Schema] | None:
    """The branches of a union (`anyOf`, `oneOf`); None for a schema that is not one."""
    parts = schema.get("anyOf", schema.get("oneOf"))
    return list(parts) if parts else None


def _counterpart(branch: Schema, candidates: list[Schema]) -> Schema | None:
    """The new union's branch that stands for an old one: the same named schema, else the one
    of the same types, else one sharing a type; None when the type went (told as narrowed)."""
    if "$ref" in branch:
        return next((c for c in candidates if c.get("$ref") == branch["$ref"]), None)
    types = _types(branch)
    same = [c for c in candidates if "$ref" not in c and _types(c) == types]
    if same:
        return same[0]
    return next((c for c in candidates if "$ref" not in c and _types(c) & types), None)


def _any_type(schema: Schema) -> bool:
    """Whether a schema takes any value: it holds nothing but annotations."""
    return set(schema) <= ANNOTATIONS


def _types(schema: Schema) -> set[str]:
    """The JSON types (or referenced schemas) a schema takes; empty: anything."""
    if "anyOf" in schema or "oneOf" in schema:
        return set().union(*(_types(part) for part in schema.get("anyOf", schema.get("oneOf"))))
    if "$ref" in schema:
        return {schema["$ref"].rsplit("/", 1)[-1]}
    kind = schema.get("type")
    if kind is None:
        return set()
    kinds = set(kind) if isinstance(kind, list) else {kind}
    # An integer is a number: widening integer -> number is not a loss.
    return kinds | ({"integer"} if "number" in kinds else set())


def _request_schemas(document: Mapping[str, Any]) -> set[str]:
    """The component schemas a request sends, directly or through another schema."""
    schemas = document.get("components", {}).get("schemas", {})
    found: set[str] = set()
    pending = [
        media.get("schema", {})
        for operations in document.get("paths", {}).values()
        for method, operation in operations.items()
        if method in METHODS
        for media in operation.get("requestBody", {}).get("content", {}).values()
    ]
    while pending:
        text = json.dumps(pending.pop())
        for name in schemas:
            if f'"#/components/schemas/{name}"' in text and name not in found:
                found.add(name)
                pending.append(schemas[name])
    return found


def write(archive: Path = ARCHIVE) -> Path:
    """Write this release's document and seal it; refuses to rewrite a sealed one."""
    archive.mkdir(parents=True, exist_ok=True)
    path = archive / f"{VERSION}.json"
    if path.exists():
        raise FileExistsError(f"{path} is archived already and never rewritten")
    path.write_text(json.dumps(current_document(), indent=2, sort_keys=True) + "\n")
    seal(archive)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.openapi_archive", description=__doc__)
    parser.add_argument("action", choices=["write", "check"])
    if parser.parse_args(argv).action == "write":
        print(f"wrote {write()}")
        return 0
    current = current_document()
    broken = {
        version: changes
        for version, document in archived_documents().items()
        if (changes := breaking_changes(document, current))
    }
    for version, changes in broken.items():
        print(f"against {version}:", *changes, sep="\n  ", file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
