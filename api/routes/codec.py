"""The codec server for the Temporal Web UI: `POST /codec/decode` and `POST /codec/encode`.

The Web UI (pointed here with `--ui-codec-endpoint`, as `make dev` does) sends the payloads it
shows to `/codec/decode` and gets them back decrypted with `PAYLOAD_KEYS`; nothing decrypted
ever reaches the Temporal server. Same authentication as the API: decoding needs `read`,
encoding (the Web UI encodes what an operator sends, e.g. a signal) `operate`. The Web UI calls
from the browser, so these routes answer CORS for `CODEC_CORS_ORIGINS` (the dev UI's by default).

Bounded: a body over `CODEC_MAX_REQUEST_BYTES` (`api/limits.py`) or more than `CODEC_MAX_PAYLOADS`
payloads is 413, and the work (parsing, base64, AES-GCM) runs in processes of its own
(`api.codec_work`), so the API keeps answering every other request while the largest allowed one
runs.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError

from api.codec_work import CodecWorkers, Direction, Payloads
from api.errors import ApiProblem
from api.schemas import problem_responses

router = APIRouter(prefix="/codec", tags=["codec"])

_TITLES = {
    "too-many-payloads": "Too many payloads",
    "bad-payload": "Bad payload",
    "undecodable-payload": "Undecodable payload",
}

# The body is read raw and parsed in the codec's worker process too: parsing a few MiB of JSON
# in the API process would hold every other request as long as the codec work itself.
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
    return await _respond(request, "decode")


@router.post(
    "/encode",
    response_model=Payloads,
    summary="Encrypt payloads for the Web UI",
    openapi_extra=_BODY,
    responses=problem_responses(400, 413, 422),
)
async def encode(request: Request) -> Response:
    return await _respond(request, "encode")


async def _respond(request: Request, direction: Direction) -> Response:
    workers: CodecWorkers = request.app.state.codec_workers
    raw = await request.body()
    outcome = await workers.run(raw, direction, request.app.state.codec_max_payloads)
    if outcome.invalid:
        raise RequestValidationError(list(outcome.invalid))
    if outcome.code:
        raise ApiProblem(outcome.status, outcome.code, _TITLES[outcome.code], outcome.detail)
    return Response(outcome.body, media_type="application/json")
