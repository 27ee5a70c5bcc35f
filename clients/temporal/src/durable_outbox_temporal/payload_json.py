"""The JSON payload converter, made cheaper without changing a byte of what it writes.

Every activity input and result, signal and update is a dataclass converted to and from JSON,
and the SDK's default converter spends most of a delivery's CPU there: it encodes a dataclass
with `dataclasses.asdict` (which deep-copies every dict and list inside it) and decodes one with
`typing.get_type_hints` (re-evaluated for every object). This converter writes the same JSON (a
dataclass as the object of its fields) and reads it into the same objects, with each class's
fields and type hints looked up once, and each type hint's reading compiled once into a
function (the SDK's `value_to_type` works out what a hint is for every value it reads: a bulk
shard's next run spent most of its first workflow task there). Why and what it saved:
docs/decisions/payload-json.md.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import functools
import types
import typing
from collections.abc import Callable
from datetime import datetime
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
    dataclasses come back here) instead of deep-copying it first.

    An instance whose `__dict__` holds exactly its fields, in their order (a dataclass without
    slots, built by its `__init__`: nearly all), is given as that dict itself, which the encoder
    only reads: building a new dict took over half of encoding a shard's carried items
    (docs/decisions/payload-json.md)."""

    def default(self, o: Any) -> Any:
        names = _field_names(type(o))
        if names is not None:
            held = getattr(o, "__dict__", None)
            if held is not None and len(held) == len(names) and tuple(held) == names:
                return held
            return {name: getattr(o, name) for name in names}
        return super().default(o)


@functools.cache
def _fields(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    return dataclasses.fields(cls)


_FIELD_NAMES: dict[type, tuple[str, ...] | None] = {}


def _field_names(cls: type) -> tuple[str, ...] | None:
    """A dataclass's field names in order; None for any other type (looked up once each)."""
    try:
        return _FIELD_NAMES[cls]
    except KeyError:
        names = (
            tuple(field.name for field in _fields(cls)) if dataclasses.is_dataclass(cls) else None
        )
        _FIELD_NAMES[cls] = names
        return names


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


_Reader = Callable[[Any], Any]


class CachedDataclassConverter(JSONTypeConverter):
    """Reads a dataclass as the SDK does (unknown keys ignored, a missing required field an
    error, init=False fields set after construction), its fields and hints looked up once.

    Each type hint met is compiled once into a reader doing what `value_to_type` does for it
    (the same checks, conversions and errors): strings, numbers, booleans, None, datetimes,
    `Any`, enums of strings or integers, `Literal`, unions, lists and dicts of those, and
    dataclasses. Any other hint is read by `value_to_type` itself."""

    def __init__(self) -> None:
        self._readers: dict[Any, _Reader] = {}

    def to_typed_value(self, hint: type, value: Any) -> Any:
        if not (isinstance(hint, type) and dataclasses.is_dataclass(hint)):
            return JSONTypeConverter.Unhandled
        return self._reader(hint)(value)

    def _reader(self, hint: Any) -> _Reader:
        try:
            return self._readers[hint]
        except KeyError:
            reader = self._readers[hint] = self._compile(hint)
            return reader
        except TypeError:  # an unhashable hint: nothing to cache it by
            return functools.partial(value_to_type, hint, custom_converters=[self])

    def _compile(self, hint: Any) -> _Reader:
        simple = _SIMPLE.get(hint)
        if simple is not None:
            return simple
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            return self._dataclass(hint)
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            for base, name in ((int, "an integer"), (str, "a string")):
                if issubclass(hint, base):
                    return functools.partial(_enum, hint, base, name)
        origin = typing.get_origin(hint)
        args = typing.get_args(hint)
        if origin is typing.Literal:
            return functools.partial(_literal, args)
        if origin is typing.Union or origin is types.UnionType:
            return functools.partial(_union, hint, [self._reader(arg) for arg in args])
        if origin is list and len(args) == 1 and _plain(args[0]):
            return functools.partial(_list, hint, self._reader(args[0]))
        if origin is dict and len(args) == 2 and args[0] is str and _plain(args[1]):
            if args[1] is Any:
                return _any_dict
            return functools.partial(_dict, hint, self._reader(args[1]))
        return functools.partial(value_to_type, hint, custom_converters=[self])

    def _dataclass(self, cls: type) -> _Reader:
        # The fields' readers on first use (a dataclass may name itself among its fields), built
        # whole before they are kept: threads may read the same class at once.
        plan: list[tuple[str, bool, _Reader]] | None = None

        def read(value: Any) -> Any:
            nonlocal plan
            fields = plan
            if fields is None:
                hints = _hints(cls)
                fields = plan = [
                    (field.name, field.init, self._reader(hints[field.name]))
                    for field in _fields(cls)
                ]
            if not isinstance(value, dict):
                raise TypeError(
                    f"Cannot convert to dataclass {cls}, value is {type(value)} not dict"
                )
            init: dict[str, Any] = {}
            later: dict[str, Any] = {}
            for name, is_init, reader in fields:
                if name not in value:
                    continue
                try:
                    converted = reader(value[name])
                except Exception as err:
                    message = f"Failed converting field {name} on dataclass {cls}"
                    raise TypeError(message) from err
                (init if is_init else later)[name] = converted
            obj = cls(**init)
            for name, converted in later.items():
                object.__setattr__(obj, name, converted)
            return obj

        return read


def _plain(arg: Any) -> bool:
    """An argument of `list[...]` or `dict[str, ...]` `value_to_type` reads with no case of its
    own (a type variable or `...` it treats apart)."""
    return not isinstance(arg, typing.TypeVar) and arg is not Ellipsis


def _str(value: Any) -> Any:
    if not isinstance(value, str):
        raise TypeError(f"Expected value to be str, was {type(value)}")
    return value if type(value) is str else str(value)


def _int(value: Any) -> Any:
    if not isinstance(value, (int, float)):
        raise TypeError(f"Expected value to be int|float, was {type(value)}")
    return value if type(value) is int else int(value)


def _float(value: Any) -> Any:
    if not isinstance(value, (int, float)):
        raise TypeError(f"Expected value to be int|float, was {type(value)}")
    return value if type(value) is float else float(value)


def _bool(value: Any) -> Any:
    if not isinstance(value, bool):
        raise TypeError(f"Expected value to be bool, was {type(value)}")
    return value


def _none(value: Any) -> Any:
    if value is not None:
        raise TypeError(f"Expected None, got value of type {type(value)}")
    return None


def _datetime(value: Any) -> Any:
    # What the SDK parses with on Python 3.11 and later (this package needs 3.11).
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError as err:
            raise TypeError(f"Failed parsing datetime string: {value}") from err
    if isinstance(value, datetime):
        return value
    raise TypeError(f"Expected datetime or ISO8601 string, got {type(value)}")


_SIMPLE: dict[Any, _Reader] = {
    Any: lambda value: value,
    str: _str,
    int: _int,
    float: _float,
    bool: _bool,
    type(None): _none,
    datetime: _datetime,
}


def _enum(hint: type[enum.Enum], base: type, name: str, value: Any) -> Any:
    if not isinstance(value, base):
        raise TypeError(f"Cannot convert to enum {hint}, value not {name}, value is {type(value)}")
    return hint(value)


def _literal(allowed: tuple[Any, ...], value: Any) -> Any:
    if value not in allowed:
        raise TypeError(f"Value {value} not in literal values {allowed}")
    return value


def _union(hint: Any, readers: list[_Reader], value: Any) -> Any:
    for reader in readers:
        try:
            return reader(value)
        except Exception:  # noqa: BLE001 - as the SDK: the next member may read it
            pass
    raise TypeError(f"Failed converting to {hint} from {value}")


def _list(hint: Any, reader: _Reader, value: Any) -> Any:
    if not isinstance(value, collections.abc.Iterable):
        raise TypeError(f"Expected {hint}, value was {type(value)}")
    converted = []
    for index, item in enumerate(value):
        try:
            converted.append(reader(item))
        except Exception as err:
            raise TypeError(f"Failed converting {hint} index {index}") from err
    return converted


def _any_dict(value: Any) -> Any:
    if not isinstance(value, collections.abc.Mapping):
        raise TypeError(f"Expected dict[str, typing.Any], value was {type(value)}")
    return dict(value)


def _dict(hint: Any, reader: _Reader, value: Any) -> Any:
    if not isinstance(value, collections.abc.Mapping):
        raise TypeError(f"Expected {hint}, value was {type(value)}")
    converted = {}
    for key, item in value.items():
        if not isinstance(key, str):
            key = value_to_type(str, key)
        try:
            converted[key] = reader(item)
        except Exception as err:
            raise TypeError(f"Failed converting value for key {key!r} in mapping {hint}") from err
    return converted


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
