"""An aggregate type from outside the repository, registered by configuration alone: a module in a
directory of its own on `sys.path`, named in `AGGREGATE_TYPES`, is served by the API and hosted
by the worker; a bad entry stops the API's start-up, naming it."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine

from api.main import create_app
from configuration.settings import SEED_AGGREGATE_TYPES
from service.aggregate_types import AggregateTypeError, load_aggregate_types
from tests.api.conftest import api_settings, open_api
from tests.conftest import email_destination
from worker import default_operations_task_queue

# A user's own type: it imports the client package's base and pydantic, nothing of the service.
ROOMS = textwrap.dedent(
    '''
    """Rooms: one guest per room."""

    from datetime import datetime

    from durable_outbox_temporal.aggregate_definition import (
        AggregateDefinition,
        Command,
        Conflict,
        Event,
    )
    from pydantic import BaseModel


    class RoomTaken(Conflict):
        """Another guest has the room."""


    class Book(Command):
        guest: str


    class RoomBooked(Event):
        guest: str


    class RoomState(BaseModel):
        guest: str | None = None


    class RoomBooking(AggregateDefinition[RoomState]):
        type_name = "room"
        state_model = RoomState
        commands = {"book": Book}
        events = (RoomBooked,)

        def initial_state(self) -> RoomState:
            return RoomState()

        def decide(self, state: RoomState, command: Command, now: datetime) -> list[Event]:
            assert isinstance(command, Book)
            if state.guest == command.guest:
                return []
            if state.guest is not None:
                raise RoomTaken(f"{state.guest} has the room")
            return [RoomBooked(guest=command.guest)]

        def evolve(self, state: RoomState, event: Event) -> RoomState:
            assert isinstance(event, RoomBooked)
            return RoomState(guest=event.guest)
    '''
)


async def test_a_type_from_outside_the_repository_is_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stack_factory, fake_provider
) -> None:
    module = f"rooms_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(ROOMS)
    monkeypatch.syspath_prepend(str(tmp_path))
    configured = f"{SEED_AGGREGATE_TYPES},{module}:RoomBooking"
    # The worker and the API each load the types from the one setting.
    stack = await stack_factory(
        email_destination(fake_provider), aggregate_types=load_aggregate_types(configured)
    )
    settings = api_settings(
        workflow_task_queue=stack.task_queue,
        operations_task_queue=default_operations_task_queue(stack.task_queue),
        aggregate_types=configured,
    )
    api = open_api(stack, settings)
    http = await api.__anext__()
    try:
        room = f"/v1/aggregates/room/r{uuid.uuid4().hex[:6]}"
        booked = await http.post(f"{room}/commands/book", json={"guest": "ada"})
        taken = await http.post(f"{room}/commands/book", json={"guest": "bob"})
        state = await http.get(room)
        types = (await http.get("/v1/aggregates")).json()
    finally:
        await api.aclose()

    assert booked.status_code == 200, booked.text
    assert [e["type"] for e in booked.json()["events"]] == ["RoomBooked"]
    assert taken.status_code == 409 and taken.json()["title"], taken.text
    assert (state.json()["state"], state.json()["version"]) == ({"guest": "ada"}, 1)
    assert [t["type"] for t in types] == ["flight", "labour", "lock", "room"]
    assert types[3]["events"] == ["RoomBooked"]


async def test_the_api_refuses_to_start_with_an_entry_that_does_not_load(engine: Engine) -> None:
    app = create_app(api_settings(aggregate_types="rooms_nowhere:RoomBooking"), engine=engine)

    with pytest.raises(AggregateTypeError, match="'rooms_nowhere:RoomBooking'"):
        async with app.router.lifespan_context(app):
            pass
