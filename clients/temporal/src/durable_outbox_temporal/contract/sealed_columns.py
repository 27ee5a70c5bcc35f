"""SQLAlchemy column types that store a caller's data sealed (`contract.sealing`).

`SealedJSON` and `SealedText` seal on the way in and open on the way out with the keys of the
engine they run on (`seal_with(engine, keys)`, called once at start by the worker and the API on
their read-model engine): code reading and writing rows sees plain values either way. An engine
without keys writes plain values, as before encryption; values already sealed are written as
they are (`enqueue_in` seals its rows itself). Only columns nobody filters or searches on in
SQL are sealed: ciphertext compares equal to nothing. Needs SQLAlchemy (the package's
`sqlalchemy` extra).
"""

from __future__ import annotations

import json
import weakref
from typing import Any

from sqlalchemy import JSON, Connection, Dialect, Engine, String
from sqlalchemy.types import TypeDecorator

from durable_outbox_temporal.contract.sealing import (
    SealedValueKeyMissing,
    ValueKeys,
    is_sealed,
    open_text,
    sealed_with,
)

# Per engine (its dialect, which an engine's connections and option copies share): the keys it
# seals with. Weak, so an engine disposed of and dropped takes its keys along.
_KEYS: weakref.WeakKeyDictionary[Dialect, ValueKeys] = weakref.WeakKeyDictionary()


def seal_with(engine: Engine | Connection, keys: ValueKeys | None) -> None:
    """Make `engine` seal the sealed columns it writes under `keys` (None: plain, as without
    payload keys) and open them with `keys`."""
    if keys is None:
        _KEYS.pop(engine.dialect, None)
    else:
        _KEYS[engine.dialect] = keys


def keys_of(engine: Engine | Connection | Dialect) -> ValueKeys | None:
    """The keys `engine` seals with; None when it writes plain values."""
    dialect = engine if isinstance(engine, Dialect) else engine.dialect
    return _KEYS.get(dialect)


def open_json(value: Any, keys: ValueKeys | None) -> Any:
    """A JSON column's stored value opened: a sealed one decrypted and parsed, a plain one
    as it is."""
    if not is_sealed(value):
        return value
    if keys is None:
        raise SealedValueKeyMissing(sealed_with(value) or "?")
    return json.loads(keys.open(value).decode("utf-8", "surrogatepass"))


def seal_json(value: Any, keys: ValueKeys | None) -> Any:
    """What a sealed JSON column stores for `value`: sealed under `keys`, or as it is without
    keys (or when it is sealed already)."""
    if value is None or keys is None or is_sealed(value):
        return value
    plain = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return keys.seal(plain.encode("utf-8", "surrogatepass"))


class SealedJSON(TypeDecorator[Any]):
    """A JSON column whose values (objects and lists: never a bare string) are stored sealed
    under the engine's keys."""

    impl = JSON()
    cache_ok = True

    def __init__(self, none_as_null: bool = False) -> None:
        super().__init__()
        # An attribute too: SQLAlchemy's statement cache keys a type by its __init__ arguments.
        self.none_as_null = none_as_null
        self.impl = JSON(none_as_null=none_as_null)

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        return seal_json(value, _KEYS.get(dialect))

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        return open_json(value, _KEYS.get(dialect))


class SealedText(TypeDecorator[str]):
    """A text column stored sealed under the engine's keys. Always sealed anew: a caller's text
    that merely looks sealed (a cancel reason, say) must not be stored as if it were."""

    impl = String()
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        keys = _KEYS.get(dialect)
        if value is None or keys is None:
            return value
        return keys.seal(value.encode("utf-8", "surrogatepass"))

    def process_result_value(self, value: str | None, dialect: Dialect) -> str | None:
        if value is None:
            return None
        return open_text(value, _KEYS.get(dialect))
