"""The sealed-value format: a round trip for any JSON or text, the key id per value, and a
value that only looks sealed, or is sealed under another key, refused by name."""

from __future__ import annotations

import pytest
from durable_outbox_temporal.codec import EncryptionCodec, new_key_setting
from durable_outbox_temporal.contract.sealed_columns import (
    SealedText,
    open_json,
    seal_json,
    seal_with,
)
from durable_outbox_temporal.contract.sealing import (
    PREFIX,
    SealedValueError,
    SealedValueKeyMissing,
    open_text,
    sealed_with,
)
from sqlalchemy import create_engine

KEYS = EncryptionCodec.from_setting(new_key_setting("k1")).value_keys()


@pytest.mark.parametrize(
    "value",
    [{"to": "ada@example.com", "n": [1, 2.5, None, True]}, [], {"odd": "\ud800 é 🙂"}],
)
def test_json_round_trips_sealed(value: object) -> None:
    sealed = seal_json(value, KEYS)

    assert isinstance(sealed, str) and sealed.startswith(f"{PREFIX}k1:")
    assert "ada" not in sealed
    assert open_json(sealed, KEYS) == value
    assert seal_json(sealed, KEYS) is sealed  # sealed already: written as it is
    assert seal_json(value, None) is value  # without keys: plain


def test_each_seal_is_new_and_names_its_key() -> None:
    first, second = KEYS.seal(b"same"), KEYS.seal(b"same")

    assert first != second
    assert sealed_with(first) == "k1" and sealed_with("plain") is None


def test_plain_text_opens_as_itself_and_sealed_needs_its_key() -> None:
    assert open_text("grace@example.com: delivered", None) == "grace@example.com: delivered"
    with pytest.raises(SealedValueKeyMissing) as missing:
        open_text(KEYS.seal(b"x"), None)
    assert missing.value.key_id == "k1"
    other = EncryptionCodec.from_setting(new_key_setting("k1")).value_keys()
    with pytest.raises(SealedValueError, match="does not authenticate"):
        other.open(KEYS.seal(b"x"))


@pytest.mark.parametrize("value", [f"{PREFIX}", f"{PREFIX}k1:", f"{PREFIX}k1:!!", f"{PREFIX}:QUJD"])
def test_a_value_that_only_looks_sealed_is_refused(value: str) -> None:
    with pytest.raises(SealedValueError, match="malformed"):
        KEYS.open(value)


def test_a_callers_text_that_looks_sealed_is_sealed_anew() -> None:
    """A cancel reason written to look sealed must not be stored as if it were."""
    column = SealedText()
    engine = create_engine("sqlite://")
    dialect = engine.dialect
    seal_with(engine, KEYS)
    forged = f"{PREFIX}k9:{'A' * 40}"

    stored = column.process_bind_param(forged, dialect)

    assert stored != forged and sealed_with(stored) == "k1"
    assert column.process_result_value(stored, dialect) == forged
