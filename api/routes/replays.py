"""Replays: send again, as new items to a target destination (the same or another), the items a
filter selects. A replay is a batch whose progress lives in Temporal."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

from durable_outbox_temporal.contract.item import ItemStatus
from durable_outbox_temporal.contract.limits import MAX_DESTINATION_LENGTH, MAX_KEY_LENGTH
from durable_outbox_temporal.contract.replay import ReplayFilter
from fastapi import APIRouter, Depends, Path, Request, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator

from api.dates import AwareUtcDatetime
from api.deps import resources_of
from api.errors import ApiProblem
from api.schemas import problem_responses
from service.replays import Replay, ReplayNeedsConfirmation, ReplayService

router = APIRouter(
    prefix="/v1/outboxes/{outbox}",
    tags=["replays"],
    responses=problem_responses(401, 403, 404, 422, 503),
)


async def get_replay_service(request: Request) -> ReplayService:
    resources = resources_of(request)
    settings = resources.settings
    return ReplayService(
        resources.items, settings.operations_task_queue, settings.replay_confirm_over
    )


ReplayServiceDep = Annotated[ReplayService, Depends(get_replay_service)]


class ReplayRequest(BaseModel):
    """Which items to replay and where to. Every filter field is optional; none selects every
    item of the outbox created before the replay begins."""

    model_config = ConfigDict(extra="forbid")

    target: str = Field(
        min_length=1,
        max_length=MAX_DESTINATION_LENGTH,
        description="the destination the new items go to (the same as the originals' or another)",
    )
    destination: str | None = Field(default=None, min_length=1, max_length=MAX_DESTINATION_LENGTH)
    statuses: list[ItemStatus] | None = Field(default=None, min_length=1, max_length=6)
    created_from: AwareUtcDatetime | None = Field(default=None, description="inclusive")
    created_to: AwareUtcDatetime | None = Field(default=None, description="exclusive")
    key_prefix: str | None = Field(default=None, min_length=1, max_length=MAX_KEY_LENGTH)
    confirm_count: int | None = Field(
        default=None,
        ge=0,
        description="required past the server's threshold (`REPLAY_CONFIRM_OVER`): the number of"
        " items the filter selects, as the 409 refusal gives it",
    )

    @model_validator(mode="after")
    def _range(self) -> ReplayRequest:
        if (
            self.created_from is not None
            and self.created_to is not None
            and self.created_from >= self.created_to
        ):
            raise ValueError("created_from must be before created_to: the range is empty")
        return self

    def filter(self) -> ReplayFilter:
        return ReplayFilter(
            destination=self.destination,
            statuses=None if self.statuses is None else [status.value for status in self.statuses],
            created_from=self.created_from,
            created_to=self.created_to,
            key_prefix=self.key_prefix,
        )


class ReplayResponse(BaseModel):
    """A replay: what it selects, where to, how far it is (`done` at the end), and Temporal's
    word for its workflow (`running`, `completed`, `failed`, `terminated`...)."""

    id: str
    outbox: str
    state: str
    target: str
    destination: str | None
    statuses: list[str] | None
    created_from: Any
    created_to: Any
    key_prefix: str | None
    created_before: Any = Field(
        description="it takes items created before it began (null until it has)"
    )
    replayed: int = Field(description="new items enqueued to the target")
    already: int = Field(description="replayed before by this replay (a repeat adds nothing)")
    erased: int = Field(description="skipped: their payload was erased")
    pruned: int = Field(description="skipped: their payload is no longer in the read model")
    pages: int
    done: bool
    finished_at: Any
    errors: list[str] = Field(description="the first keys not replayed, and why")
    failure: str | None = Field(description="why it stopped before its end, if it did")
    links: dict[str, str]

    @classmethod
    def of(cls, replay: Replay) -> ReplayResponse:
        progress = replay.progress
        which = progress.filter
        return cls(
            id=replay.id,
            outbox=progress.outbox,
            state=replay.state,
            target=progress.target,
            destination=which.destination,
            statuses=which.statuses,
            created_from=which.created_from,
            created_to=which.created_to,
            key_prefix=which.key_prefix,
            created_before=progress.created_before,
            replayed=progress.replayed,
            already=progress.already,
            erased=progress.erased,
            pruned=progress.pruned,
            pages=progress.pages,
            done=progress.done,
            finished_at=progress.finished_at,
            errors=progress.errors,
            failure=progress.failure,
            links={"self": f"/v1/outboxes/{quote(progress.outbox, safe='')}/replays/{replay.id}"},
        )


@router.post(
    "/replays",
    response_model=ReplayResponse,
    status_code=202,
    responses=problem_responses(409),
    summary="Replay the items a filter selects to a destination, as a batch",
)
async def start_replay(
    outbox: str, body: ReplayRequest, response: Response, replays: ReplayServiceDep
) -> ReplayResponse:
    """Starts a batch (a `ReplayBatch` workflow) and answers at once; follow it at
    `links.self` (also the `Location` header). 404 for an unknown target; 409, with the
    `count`, past `REPLAY_CONFIRM_OVER` items unless `confirm_count` is that count."""
    try:
        replay = await replays.start(outbox, body.filter(), body.target, body.confirm_count)
    except ReplayNeedsConfirmation as err:
        raise ApiProblem.from_outbox_error(err, count=err.count) from None
    result = ReplayResponse.of(replay)
    response.headers["Location"] = result.links["self"]
    return result


@router.get("/replays/{replay_id}", response_model=ReplayResponse, summary="A replay's progress")
async def get_replay(
    outbox: str,
    replay_id: Annotated[str, Path(pattern=r"^[0-9a-f]{32}$")],
    replays: ReplayServiceDep,
) -> ReplayResponse:
    """From Temporal, not from the API process: any API instance, restarted or not, answers."""
    return ReplayResponse.of(await replays.get(outbox, replay_id))
