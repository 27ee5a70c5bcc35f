"""Payload encryption: a Temporal payload codec (AES-256-GCM) on every client and worker.

Everything the SDK sends through its data converter — workflow inputs and results, signal,
update and query arguments and answers, memos, activity inputs and results, failure details —
is encrypted before it leaves the process, so histories in the server's database and in the
Web UI hold ciphertext only. The Web UI reads them through the codec server the API serves
(`POST /codec/decode`), to those allowed to.

Keys: `PAYLOAD_KEYS`, a comma-separated list of `key-id:base64-key` (32 bytes each), or
`PAYLOAD_KEYS_FILE`, a file holding that list (`make dev` keeps its keys in
`.data/payload-keys`); the first encrypts, all decrypt. Rotating is prepending a new key: new
payloads use it, histories written under the old ones still decode as long as those stay in the
list. Each payload records its key id in its metadata. A payload without the encrypted encoding
(written before encryption was on) passes through unchanged, so turning it on never breaks a
running workflow.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.converter import DataConverter, ExternalStorage, PayloadCodec

from durable_outbox_temporal.contract.sealing import ValueKeys
from durable_outbox_temporal.payload_json import OutboxPayloadConverter

ENCODING = b"binary/encrypted"
KEY_ID = "encryption-key-id"
_NONCE_BYTES = 12


class CodecKeyError(ValueError):
    """The configured keys are unusable, or a payload names a key that is not configured."""


class PayloadKeyMissing(CodecKeyError):
    """A payload is encrypted under a key this process does not have: it was started without
    the stack's `PAYLOAD_KEYS` (or with an older list than the one that wrote the payload)."""

    def __init__(self, key_id: str, what: str = "a payload") -> None:
        self.key_id = key_id
        super().__init__(
            f"{what} is encrypted with key {key_id!r}, which this process does not have: set"
            " PAYLOAD_KEYS to the stack's keys (or PAYLOAD_KEYS_FILE to a file holding them;"
            " `make dev` keeps them in .data/payload-keys)"
        )


class EncryptionCodec(PayloadCodec):
    """AES-256-GCM over each whole serialized payload (its metadata too)."""

    def __init__(self, keys: Mapping[str, bytes], current: str) -> None:
        if current not in keys:
            raise CodecKeyError(f"the current key {current!r} is not among the keys")
        for key_id, key in keys.items():
            if len(key) != 32:
                raise CodecKeyError(f"key {key_id!r} is {len(key)} bytes; AES-256 needs 32")
        self._keys = dict(keys)
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keys.items()}
        self.current = current

    def __reduce__(self) -> tuple[type[EncryptionCodec], tuple[dict[str, bytes], str]]:
        # Pickled as its keys, for processes that rebuild it (the API's codec workers).
        return (EncryptionCodec, (self._keys, self.current))

    @classmethod
    def from_setting(cls, setting: str) -> EncryptionCodec:
        """From `PAYLOAD_KEYS` (`id:base64,id:base64`, the first one current)."""
        keys: dict[str, bytes] = {}
        for entry in (part.strip() for part in setting.split(",")):
            if not entry:
                continue
            key_id, sep, encoded = entry.partition(":")
            if not sep or not key_id:
                raise CodecKeyError("PAYLOAD_KEYS entries are key-id:base64-key")
            try:
                keys[key_id] = base64.b64decode(encoded, validate=True)
            except binascii.Error as err:
                raise CodecKeyError(f"PAYLOAD_KEYS key {key_id!r} is not base64") from err
        if not keys:
            raise CodecKeyError("PAYLOAD_KEYS names no key")
        return cls(keys, next(iter(keys)))

    def value_keys(self) -> ValueKeys:
        """The same keys for values at rest in SQL (`contract.sealing`): the read model's
        sealed columns and `enqueue_in`'s rows."""
        return ValueKeys(self._ciphers, self.current)

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        cipher = self._ciphers[self.current]
        encoded = []
        for payload in payloads:
            nonce = os.urandom(_NONCE_BYTES)
            sealed = cipher.encrypt(nonce, payload.SerializeToString(), self.current.encode())
            encoded.append(
                Payload(
                    metadata={"encoding": ENCODING, KEY_ID: self.current.encode()},
                    data=nonce + sealed,
                )
            )
        return encoded

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self._decode_one(payload) for payload in payloads]

    def _decode_one(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != ENCODING:
            return payload  # written before encryption was on
        key_id = payload.metadata.get(KEY_ID, b"").decode()
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise PayloadKeyMissing(key_id)
        nonce, sealed = payload.data[:_NONCE_BYTES], payload.data[_NONCE_BYTES:]
        try:
            plain = cipher.decrypt(nonce, sealed, key_id.encode())
        except InvalidTag as err:
            raise CodecKeyError(f"payload under key {key_id!r} does not authenticate") from err
        return Payload.FromString(plain)


class KeylessCodec(PayloadCodec):
    """The codec of a process without keys: payloads go out as they are, and an encrypted one
    coming in raises `PayloadKeyMissing` naming its key (the SDK alone would raise a bare
    `KeyError` on the unknown encoding)."""

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        for payload in payloads:
            if payload.metadata.get("encoding") == ENCODING:
                raise PayloadKeyMissing(encrypted_with(payload) or "?")
        return list(payloads)


def encrypted_with(payload: Payload) -> str | None:
    """The key id an encrypted payload names; None for a payload in plain text."""
    if payload.metadata.get("encoding") != ENCODING:
        return None
    return payload.metadata.get(KEY_ID, b"").decode(errors="replace")


def codec_from_environment(environ: Mapping[str, str] | None = None) -> EncryptionCodec | None:
    """The codec `PAYLOAD_KEYS` describes, or the keys in the file `PAYLOAD_KEYS_FILE` names;
    None when neither is set (payloads in plain text)."""
    variables = os.environ if environ is None else environ
    setting = variables.get("PAYLOAD_KEYS", "")
    path = variables.get("PAYLOAD_KEYS_FILE", "")
    if not setting.strip() and path.strip():
        try:
            setting = Path(path).read_text()
        except OSError as err:
            raise CodecKeyError(f"PAYLOAD_KEYS_FILE {path}: {err.strerror or err}") from err
        if not setting.strip():
            raise CodecKeyError(f"PAYLOAD_KEYS_FILE {path} holds no key")
    return EncryptionCodec.from_setting(setting) if setting.strip() else None


def data_converter(
    codec: PayloadCodec | None, external_storage: ExternalStorage | None = None
) -> DataConverter:
    """The product's converter (`durable_outbox_temporal.payload_json`), with `codec` and claim
    checks
    (`external_storage`) when given. Without a codec, an encrypted payload read raises
    `PayloadKeyMissing` (`KeylessCodec`)."""
    return dataclasses.replace(
        DataConverter.default,
        payload_converter_class=OutboxPayloadConverter,
        payload_codec=codec if codec is not None else KeylessCodec(),
        external_storage=external_storage,
    )


def new_key_setting(key_id: str) -> str:
    """A fresh `PAYLOAD_KEYS` entry (what `make dev` generates once under `.data/`)."""
    return f"{key_id}:{base64.b64encode(AESGCM.generate_key(bit_length=256)).decode()}"
