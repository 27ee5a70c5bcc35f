"""Async projectors over REST: status, rows with declared filters only, rebuild, problems."""

from __future__ import annotations

from examples.labour.projectors import LABOUR_HISTORY_PROJECTOR
from readmodel.projectors import base as projectors
from tests.api.conftest import Api
from tests.api.test_items import assert_problem
from tests.readmodel.test_projectors import a_labour


async def test_projectors_through_the_api(api: Api) -> None:
    http, engine = api.http, api.stack.engine
    a_labour(engine, "lab-1", "m1")
    a_labour(engine, "lab-2", "m2")

    before = (await http.get("/v1/projectors")).json()
    projectors.project_batch(engine, LABOUR_HISTORY_PROJECTOR)  # what its runner does
    status = (await http.get("/v1/projectors/labour_history")).json()
    rows = (await http.get("/v1/projectors/labour_history/rows", params={"mother": "m1"})).json()
    rebuilt = await http.post("/v1/projectors/labour_history/rebuild")
    emptied = (await http.get("/v1/projectors/labour_history/rows")).json()

    assert [(p["name"], p["status"], p["lag"]) for p in before] == [
        ("labour_history", "running", 24)
    ]
    assert (status["lag"], status["consecutive_failures"], status["last_error"]) == (0, 0, None)
    assert [(r["labour_id"], r["status"], r["announcements"]) for r in rows["items"]] == [
        ("lab-1", "completed", 1)
    ]
    assert rows["next_after"] is None
    assert rebuilt.status_code == 200
    assert (rebuilt.json()["position"], rebuilt.json()["lag"]) == (0, 24)
    assert rebuilt.json()["rebuilt_at"] is not None
    assert emptied["items"] == []


async def test_projector_problems(api: Api) -> None:
    http = api.http
    unknown_filter = await http.get("/v1/projectors/labour_history/rows", params={"colour": "red"})
    assert_problem(unknown_filter, 422, "invalid-request")
    assert "colour" in unknown_filter.json()["detail"]
    for response in (
        await http.get("/v1/projectors/nope"),
        await http.post("/v1/projectors/nope/rebuild"),
        await http.get("/v1/projectors/nope/rows"),
    ):
        assert_problem(response, 404, "unknown-projector")
    assert (
        await http.get("/v1/projectors/labour_history/rows", params={"limit": 0})
    ).status_code == 422
