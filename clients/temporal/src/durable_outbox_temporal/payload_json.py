"""The JSON payload converter, made cheaper without changing a byte of what it writes.

Every activity input and result, signal and update is a dataclass converted to and from JSON,
and the SDK's default converter spends most of a delivery's CPU there: it encodes a dataclass
with `dataclasses.asdict` (which deep-copies every dict and list inside it) and decodes one with
`typing.get_type_hints` (re-evaluated for every object). This converter writes the same JSON (a
dataclass as the object of its fields) and reads it into the same objects, with each class's
fields and type hints looked up once. Why and what it saved: docs/decisions/payload-json.md.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any

from temporalio.converter import (
    AdvancedJSONEncoder,
    CompositePayloadConverter,
    DefaultPayloadConverter,
    JSONPlainPayloadConverter,
    JSONTypeConverter,
    value_to_type,
)


class ShallowDataclassEncoder(AdvancedJSONEncoder):
    """A dataclass as the mapping of its fields; the encoder walks what they hold (so nested
    dataclasses come back here) instead of deep-copying it first."""

    def default(self, o: Any) -> Any:
        if dataclasses.is_dataclass(o) and not isinstance(o, type):
            return {field.name: getattr(o, field.name) for field in _fields(type(o))}
        return super().default(o)


@functools.cache
def _fields(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    return dataclasses.fields(cls)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


class CachedDataclassConverter(JSONTypeConverter):
    """Reads a dataclass as the SDK does (unknown keys ignored, a missing required field an
    error, init=False fields set after construction), its fields and hints looked up once."""

    def to_typed_value(self, hint: type, value: Any) -> Any:
        if not (isinstance(hint, type) and dataclasses.is_dataclass(hint)):
            return JSONTypeConverter.Unhandled
        if not isinstance(value, dict):
            raise TypeError(f"Cannot convert to dataclass {hint}, value is {type(value)} not dict")
        hints = _hints(hint)
        init: dict[str, Any] = {}
        later: dict[str, Any] = {}
        for field in _fields(hint):
            if field.name not in value:
                continue
            try:
                converted = value_to_type(hints[field.name], value[field.name], [self])
            except Exception as err:
                message = f"Failed converting field {field.name} on dataclass {hint}"
                raise TypeError(message) from err
            (init if field.init else later)[field.name] = converted
        obj = hint(**init)
        for name, converted in later.items():
            object.__setattr__(obj, name, converted)
        return obj


class OutboxPayloadConverter(CompositePayloadConverter):
    """The SDK's default payload converter with the JSON one above in place of its own."""

    def __init__(self) -> None:
        json_converter = JSONPlainPayloadConverter(
            encoder=ShallowDataclassEncoder, custom_type_converters=[CachedDataclassConverter()]
        )
        super().__init__(
            *(
                json_converter if isinstance(converter, JSONPlainPayloadConverter) else converter
                for converter in DefaultPayloadConverter.default_encoding_payload_converters
            )
        )
