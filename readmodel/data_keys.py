"""Data keys: a random AES-256-GCM key per scope (an aggregate, the subject index), kept in the
read model's `data_keys` table sealed under the payload keys. Deleting a scope's keys erases
every value sealed under them, wherever a copy of the value went (backups, replicas): the
value stays, unreadable. That is crypto-shredding; why it is done per aggregate:
docs/decisions/aggregate-crypto-shredding.md.

A value sealed under a data key is text, `dkey1:<key id>:<base64 of nonce + ciphertext + tag>`,
so it fits the JSON column it replaces. A scope shredded and written to again gets a new key (its
next generation): what was written before the shred stays unreadable.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy import Connection, bindparam, func, select, update
from sqlalchemy.dialects import postgresql, sqlite

from readmodel.models import DATA_KEYS

PREFIX = "dkey1:"
_NONCE_BYTES = 12
_KEY_BYTES = 32
# Bound into every value beside the key id: a value never opens under another key row.
_PURPOSE = b"data-key:"


class DataKey:
    """One data key: its row id (named by every value sealed under it) and its cipher."""

    def __init__(self, key_id: int, key: bytes) -> None:
        self.id = key_id
        self.raw = key
        self._cipher = AESGCM(key)

    def seal_json(self, value: Any) -> str:
        plain = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._cipher.encrypt(nonce, plain.encode("utf-8", "surrogatepass"), _aad(self.id))
        return f"{PREFIX}{self.id}:{base64.b64encode(nonce + sealed).decode()}"

    def open_json(self, value: str) -> Any:
        data = base64.b64decode(value.rsplit(":", 1)[1])
        try:
            plain = self._cipher.decrypt(data[:_NONCE_BYTES], data[_NONCE_BYTES:], _aad(self.id))
        except InvalidTag as err:
            raise ValueError(f"a value under data key {self.id} does not authenticate") from err
        return json.loads(plain.decode("utf-8", "surrogatepass"))


def is_data_sealed(value: object) -> bool:
    """Whether `value` is sealed under a data key (anything else is stored as it is)."""
    return isinstance(value, str) and value.startswith(PREFIX)


def key_id_of(value: str) -> int:
    return int(value[len(PREFIX) :].split(":", 1)[0])


# Built once: every event-store write runs it (docs/decisions/aggregate-crypto-shredding.md).
_NEWEST = (
    select(DATA_KEYS.c.id, DATA_KEYS.c.generation, DATA_KEYS.c.key)
    .where(DATA_KEYS.c.scope == bindparam("scope"))
    .order_by(DATA_KEYS.c.generation.desc())
    .limit(1)
)


def current_key(connection: Connection, scope: str) -> DataKey:
    """The scope's key to seal with, made on first use and after a shred (its next
    generation). Callers serialise writers of one scope (the event store's lock)."""
    newest = connection.execute(_NEWEST, {"scope": scope}).first()
    if newest is not None and newest.key is not None:
        return DataKey(newest.id, base64.b64decode(newest.key))
    generation = 1 if newest is None else newest.generation + 1
    key = AESGCM.generate_key(bit_length=_KEY_BYTES * 8)
    insert = postgresql.insert if connection.dialect.name == "postgresql" else sqlite.insert
    connection.execute(
        insert(DATA_KEYS)
        .values(
            scope=scope,
            generation=generation,
            key=base64.b64encode(key).decode(),
            created_at=datetime.now(UTC),
        )
        .on_conflict_do_nothing(index_elements=["scope", "generation"])
    )
    # Another writer may have made this generation first: its key is the one.
    made = connection.execute(
        select(DATA_KEYS.c.id, DATA_KEYS.c.key).where(
            DATA_KEYS.c.scope == scope, DATA_KEYS.c.generation == generation
        )
    ).one()
    return DataKey(made.id, base64.b64decode(made.key))


def keys_by_id(connection: Connection, values: Iterable[object]) -> dict[int, DataKey | None]:
    """The keys the sealed `values` name, by id; None for a shredded one."""
    wanted = {
        key_id_of(value) for value in values if isinstance(value, str) and is_data_sealed(value)
    }
    if not wanted:
        return {}
    rows = connection.execute(
        select(DATA_KEYS.c.id, DATA_KEYS.c.key).where(DATA_KEYS.c.id.in_(sorted(wanted)))
    ).all()
    found: dict[int, DataKey | None] = dict.fromkeys(wanted)
    for row in rows:
        found[row.id] = None if row.key is None else DataKey(row.id, base64.b64decode(row.key))
    return found


def open_value(value: Any, keys: dict[int, DataKey | None], shredded: Any) -> Any:
    """`value` opened with `keys` (from `keys_by_id`); `shredded` where its key was deleted; a
    value not sealed under a data key (written before it was) as it is."""
    if not is_data_sealed(value):
        return value
    key = keys.get(key_id_of(value))
    return shredded if key is None else key.open_json(value)


def shred(connection: Connection, scope: str, now: datetime) -> datetime | None:
    """Delete every key of the scope: `now` when one was deleted, when it was last shredded
    when it had been already, None when it never had a key."""
    deleted = connection.execute(
        update(DATA_KEYS)
        .where(DATA_KEYS.c.scope == scope, DATA_KEYS.c.key.is_not(None))
        .values(key=None, shredded_at=now)
    )
    if deleted.rowcount:
        return now
    found: datetime | None = connection.execute(
        select(func.max(DATA_KEYS.c.shredded_at)).where(DATA_KEYS.c.scope == scope)
    ).scalar_one_or_none()
    return found


def _aad(key_id: int) -> bytes:
    return _PURPOSE + str(key_id).encode()
