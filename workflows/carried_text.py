"""What a bulk shard carries across continue-as-new beyond one task's items, as JSON text
(`ShardInput.later`), written and read by orjson.

A continue-as-new writes every item the shard holds in its one last workflow task, and the SDK
fails a task whose code does not yield within 2 s: the JSON encoder set the size where a shard
can no longer continue as new. orjson writes the same JSON as the payload converter (a
dataclass as the object of its fields, keys sorted, compact) about three times faster: only a
character past ASCII differs, written as itself rather than as a `\\u` escape, which reads back
the same. Its one difference that would matter, a non-finite number written as `null`, cannot
arise: every number an item carries is validated finite where it enters (payloads, policies,
debounce windows). Reading takes what json would (`NaN`, a lone surrogate, a number past 64
bits, from a text an older release wrote) by falling back to it.
Why: docs/decisions/shard-carry-in-parts.md
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, TypeVar

import orjson
from durable_outbox_temporal.payload_json import CachedDataclassConverter, ShallowDataclassEncoder
from temporalio.converter import value_to_type

T = TypeVar("T")

_ENCODER = ShallowDataclassEncoder()
_READERS = [CachedDataclassConverter()]
# Dataclasses and datetimes through `_default`, as the payload converter writes them.
_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return _ENCODER.default(value)


def write(value: Any) -> str:
    """`value` as JSON text, as the payload converter would write it."""
    return orjson.dumps(value, default=_default, option=_OPTIONS).decode()


def read(text: str, hint: type[T]) -> T:
    """`text` read as `hint`, as the payload converter would read it."""
    try:
        document = orjson.loads(text)
    except orjson.JSONDecodeError:
        document = json.loads(text)
    read_value: T = value_to_type(hint, document, _READERS)
    return read_value
