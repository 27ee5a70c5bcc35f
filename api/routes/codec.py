"""The codec server for the Temporal Web UI: `POST /codec/decode` and `POST /codec/encode`.

The Web UI (pointed here with `--ui-codec-endpoint`, as `make dev` does) sends the payloads it
shows to `/codec/decode` and gets them back decrypted with `PAYLOAD_KEYS`; nothing decrypted
ever reaches the Temporal server. Same authentication as the API: decoding needs `read`,
encoding (the Web UI encodes what an operator sends, e.g. a signal) `operate`. The Web UI calls
from the browser, so these routes answer CORS for `CODEC_CORS_ORIGINS` (the dev UI's by default).
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Sequence

from durable_outbox_temporal.codec import CodecKeyError, EncryptionCodec
from fastapi import APIRouter, Request
from google.protobuf.message import DecodeError
from pydantic import BaseModel
from temporalio.api.common.v1 import Payload

from api.errors import ApiProblem

router = APIRouter(prefix="/codec", tags=["codec"])


class JsonPayload(BaseModel):
    """A payload as the Web UI's codec protocol sends it: base64 metadata values and data."""

    metadata: dict[str, str] = {}
    data: str = ""


class Payloads(BaseModel):
    payloads: list[JsonPayload]


@router.post("/decode", response_model=Payloads, summary="Decrypt payloads for the Web UI")
async def decode(body: Payloads, request: Request) -> Payloads:
    codec = _codec(request)
    return await _apply(body, None if codec is None else codec.decode)


@router.post("/encode", response_model=Payloads, summary="Encrypt payloads for the Web UI")
async def encode(body: Payloads, request: Request) -> Payloads:
    codec = _codec(request)
    return await _apply(body, None if codec is None else codec.encode)


def _codec(request: Request) -> EncryptionCodec | None:
    codec: EncryptionCodec | None = request.app.state.codec
    return codec


async def _apply(
    body: Payloads, transform: Callable[[Sequence[Payload]], Awaitable[list[Payload]]] | None
) -> Payloads:
    try:
        payloads = [
            Payload(
                metadata={k: base64.b64decode(v) for k, v in p.metadata.items()},
                data=base64.b64decode(p.data),
            )
            for p in body.payloads
        ]
    except ValueError as err:
        raise ApiProblem(400, "bad-payload", "Bad payload", f"not base64: {err}") from err
    if transform is not None:
        try:
            payloads = await transform(payloads)
        except CodecKeyError as err:
            raise ApiProblem(422, "undecodable-payload", "Undecodable payload", str(err)) from err
        except (ValueError, DecodeError) as err:
            # A key id that is not UTF-8, a ciphertext too short to hold a nonce, plaintext that
            # is no payload: what a hand-made request holds, never what our codec wrote.
            raise ApiProblem(
                422,
                "undecodable-payload",
                "Undecodable payload",
                f"not a payload this codec wrote ({type(err).__name__})",
            ) from err
    return Payloads(
        payloads=[
            JsonPayload(
                metadata={k: base64.b64encode(v).decode() for k, v in p.metadata.items()},
                data=base64.b64encode(p.data).decode(),
            )
            for p in payloads
        ]
    )
