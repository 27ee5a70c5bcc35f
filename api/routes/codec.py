"""The codec server for the Temporal Web UI: `POST /codec/decode` and `POST /codec/encode`.

The Web UI (pointed here with `--ui-codec-endpoint`, as `make dev` does) sends the payloads it
shows to `/codec/decode` and gets them back decrypted with `PAYLOAD_KEYS`; nothing decrypted
ever reaches the Temporal server. Same authentication as the API: decoding needs `read`,
encoding (the Web UI encodes what an operator sends, e.g. a signal) `operate`. The Web UI calls
from the browser, so these routes answer CORS for `CODEC_CORS_ORIGINS` (the dev UI's by default).

Bounded: a body over `CODEC_MAX_REQUEST_BYTES` (`api/limits.py`) or more than `CODEC_MAX_PAYLOADS`
payloads is 413, and the work (parsing, base64, AES-GCM) runs on a worker thread, so the event loop
keeps answering every other request while the largest allowed one runs.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable, Sequence

from durable_outbox_temporal.codec import CodecKeyError, EncryptionCodec
from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from google.protobuf.message import DecodeError
from pydantic import BaseModel, ValidationError
from temporalio.api.common.v1 import Payload

from api.errors import ApiProblem
from api.schemas import problem_responses

router = APIRouter(prefix="/codec", tags=["codec"])
Transform = Callable[[Sequence[Payload]], Awaitable[list[Payload]]]


class JsonPayload(BaseModel):
    """A payload as the Web UI's codec protocol sends it: base64 metadata values and data."""

    metadata: dict[str, str] = {}
    data: str = ""


class Payloads(BaseModel):
    payloads: list[JsonPayload]


# The body is read raw and parsed on the worker thread too: parsing a few MiB of JSON on the
# event loop would hold every other request as long as the codec work itself.
_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Payloads"}}},
    }
}


@router.post(
    "/decode",
    response_model=Payloads,
    summary="Decrypt payloads for the Web UI",
    openapi_extra=_BODY,
    responses=problem_responses(400, 413, 422),
)
async def decode(request: Request) -> Response:
    codec = _codec(request)
    return await _respond(request, None if codec is None else codec.decode)


@router.post(
    "/encode",
    response_model=Payloads,
    summary="Encrypt payloads for the Web UI",
    openapi_extra=_BODY,
    responses=problem_responses(400, 413, 422),
)
async def encode(request: Request) -> Response:
    codec = _codec(request)
    return await _respond(request, None if codec is None else codec.encode)


def _codec(request: Request) -> EncryptionCodec | None:
    codec: EncryptionCodec | None = request.app.state.codec
    return codec


async def _respond(request: Request, transform: Transform | None) -> Response:
    most: int = request.app.state.codec_max_payloads
    raw = await request.body()
    content = await asyncio.to_thread(_work, raw, transform, most)
    return Response(content, media_type="application/json")


def _work(raw: bytes, transform: Transform | None, most: int) -> bytes:
    """On a worker thread: parse, check the count, transform, serialise. The codec's coroutines
    do CPU work only, never await I/O, so they run to completion in a loop of the thread's own."""
    try:
        body = Payloads.model_validate_json(raw)
    except ValidationError as err:
        raise RequestValidationError(
            [{**error, "loc": ("body", *error["loc"])} for error in err.errors()]
        ) from err
    if len(body.payloads) > most:
        raise ApiProblem(
            413,
            "too-many-payloads",
            "Too many payloads",
            f"{len(body.payloads)} payloads in one request; at most {most} (CODEC_MAX_PAYLOADS)",
        )
    return asyncio.run(_apply(body, transform)).model_dump_json().encode()


async def _apply(body: Payloads, transform: Transform | None) -> Payloads:
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
