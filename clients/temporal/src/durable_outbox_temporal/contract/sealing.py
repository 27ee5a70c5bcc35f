"""Sealed values: a caller's data at rest in a SQL column, encrypted under the payload keys.

The read model (and the transactional outbox's `outbox_pending` rows) keep what a caller sent
(payloads, recipients' addresses, event details, attempt bodies, aggregate events and state)
sealed with AES-256-GCM under the same keys as Temporal's payload codec
(`durable_outbox_temporal.codec`, `PAYLOAD_KEYS`). A sealed value is text:

    sealed1:<key id>:<base64 of nonce + ciphertext + tag>

so it fits the column it replaces (a JSON column holds it as a JSON string, which none of the
sealed JSON columns ever holds in plain). Each value names its key, so values sealed under an
older key still open while that key is configured; a value that is not sealed opens as itself,
so rows written before the keys were set keep reading, and no data migration is needed.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

PREFIX = "sealed1:"
_NONCE_BYTES = 12
# Bound into every seal beside the key id: a sealed value never opens as a Temporal payload's
# ciphertext (the codec binds the key id alone), nor the other way round.
_PURPOSE = b"read-model-value:"


class SealedValueError(ValueError):
    """A sealed value cannot be opened: its key is not configured, or it does not
    authenticate under the key of that id (another key under the same id, or tampered)."""

    def __init__(self, key_id: str, message: str) -> None:
        self.key_id = key_id
        super().__init__(message)


class SealedValueKeyMissing(SealedValueError):
    """A stored value is sealed under a key this process does not have."""

    def __init__(self, key_id: str) -> None:
        super().__init__(
            key_id,
            f"a stored value is encrypted with key {key_id!r}, which this process does not have:"
            " set PAYLOAD_KEYS (or PAYLOAD_KEYS_FILE) to a list holding that key",
        )


class ValueKeys:
    """Seals with the current key and opens with any configured one."""

    def __init__(self, ciphers: Mapping[str, AESGCM], current: str) -> None:
        if current not in ciphers:
            raise ValueError(f"the current key {current!r} is not among the keys")
        self._ciphers = dict(ciphers)
        self.current = current

    @property
    def key_ids(self) -> list[str]:
        """Every configured key id, the current one first."""
        return [self.current, *(key_id for key_id in self._ciphers if key_id != self.current)]

    def seal(self, plain: bytes) -> str:
        """`plain` sealed under the current key."""
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._ciphers[self.current].encrypt(nonce, plain, _aad(self.current))
        return f"{PREFIX}{self.current}:{base64.b64encode(nonce + sealed).decode()}"

    def open(self, value: str) -> bytes:
        """The plain bytes of a sealed value; raises `SealedValueError` (or its
        `SealedValueKeyMissing`) when it cannot."""
        key_id, data = _parts(value)
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise SealedValueKeyMissing(key_id)
        try:
            return cipher.decrypt(data[:_NONCE_BYTES], data[_NONCE_BYTES:], _aad(key_id))
        except InvalidTag as err:
            raise SealedValueError(
                key_id,
                f"a stored value under key {key_id!r} does not authenticate: the key of that id"
                " is not the one it was sealed with",
            ) from err


def is_sealed(value: object) -> bool:
    """Whether `value` is a sealed value (anything else is plain)."""
    return isinstance(value, str) and value.startswith(PREFIX)


def sealed_with(value: object) -> str | None:
    """The key id a sealed value names; None for a plain value."""
    if not is_sealed(value):
        return None
    assert isinstance(value, str)
    return _parts(value)[0]


def open_text(value: str, keys: ValueKeys | None) -> str:
    """`value` opened as text when sealed; as it is when plain."""
    if not is_sealed(value):
        return value
    if keys is None:
        raise SealedValueKeyMissing(sealed_with(value) or "?")
    return keys.open(value).decode("utf-8", "surrogatepass")


def _parts(value: str) -> tuple[str, bytes]:
    # Key ids never hold ':' (`PAYLOAD_KEYS` entries are `id:key`) and base64 never does.
    key_id, sep, encoded = value[len(PREFIX) :].rpartition(":")
    try:
        data = base64.b64decode(encoded, validate=True)
    except binascii.Error:
        data = b""
    if not sep or not key_id or len(data) < _NONCE_BYTES + 16:
        raise SealedValueError(key_id or "?", "a stored value looks sealed but is malformed")
    return key_id, data


def _aad(key_id: str) -> bytes:
    return _PURPOSE + key_id.encode()
