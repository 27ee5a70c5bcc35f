"""A command's `Idempotency-Key` stands for one command: a repeat with the same command and
payload answers the first outcome, another command or payload under it is a 409, as for items.
Ids remembered before hashes were kept (an older run's carry) are taken as the same command."""

from __future__ import annotations

import uuid

from durable_outbox_temporal.aggregates import AggregateClient
from durable_outbox_temporal.contract.aggregate import (
    WORKFLOW_TYPE,
    AggregateCarry,
    AggregateErrorType,
    AggregateInput,
    CommandResult,
    aggregate_workflow_id,
)

from tests.api.conftest import Api
from tests.api.test_items import assert_problem
from tests.conftest import SEED_TYPES
from worker import default_operations_task_queue


def lock_url(lock: str, command: str) -> str:
    return f"/v1/aggregates/lock/{lock}/commands/{command}"


async def test_a_reused_key_with_another_payload_is_a_409_and_changes_nothing(api: Api) -> None:
    lock = f"lock-{uuid.uuid4().hex[:6]}"
    key = {"Idempotency-Key": "acquire-1"}

    first = await api.http.post(
        lock_url(lock, "acquire"), json={"holder": "h1", "ttl_s": 30}, headers=key
    )
    reordered = await api.http.post(
        lock_url(lock, "acquire"), json={"ttl_s": 30, "holder": "h1"}, headers=key
    )
    other_payload = await api.http.post(
        lock_url(lock, "acquire"), json={"holder": "h2", "ttl_s": 30}, headers=key
    )
    other_command = await api.http.post(
        lock_url(lock, "release"), json={"holder": "h1"}, headers=key
    )
    state = (await api.http.get(f"/v1/aggregates/lock/{lock}")).json()

    assert first.status_code == 200 and first.json()["version"] == 1, first.text
    # The same command, its payload's members in another order: a repeat.
    assert reordered.status_code == 200 and reordered.json()["duplicate"] is True
    for refused in (other_payload, other_command):
        problem = assert_problem(refused, 409, "/problems/idempotency-conflict")
        assert problem["code"] == "idempotency-conflict"
        assert "acquire-1" in problem["detail"]
    assert state["version"] == 1 and state["state"]["holder"] == "h1"


async def test_a_reused_id_of_a_signalled_command_lands_in_the_rejected_log(api: Api) -> None:
    lock = f"lock-{uuid.uuid4().hex[:6]}"
    aggregates = AggregateClient(
        api.stack.client,
        api.stack.task_queue,
        definitions=SEED_TYPES.definitions,
        operations_task_queue=default_operations_task_queue(api.stack.task_queue),
    )

    await aggregates.command("lock", lock, "acquire", {"holder": "h1", "ttl_s": 30}, command_id="a")
    await aggregates.send("lock", lock, "acquire", {"holder": "h2", "ttl_s": 30}, command_id="a")
    await aggregates.send("lock", lock, "release", {"holder": "h1"}, command_id="r")
    view = await aggregates.state("lock", lock)
    rejected = await aggregates.rejected("lock", lock)

    # The release ran after the refused signal: the signals were taken in order.
    assert view.version == 2 and view.state["holder"] is None
    assert [(r.request.command_id, r.error_type) for r in rejected] == [
        ("a", AggregateErrorType.IDEMPOTENCY_CONFLICT)
    ]


async def test_fields_the_sender_generates_afresh_do_not_count(api: Api) -> None:
    # As the effect executor sends an issued command's generated tokens: a new value each try.
    lock = f"lock-{uuid.uuid4().hex[:6]}"
    aggregates = AggregateClient(
        api.stack.client, api.stack.task_queue, definitions=SEED_TYPES.definitions
    )

    async def acquire(holder: str, ttl_s: int) -> CommandResult:
        return await aggregates.command(
            "lock",
            lock,
            "acquire",
            {"holder": holder, "ttl_s": ttl_s},
            command_id="effect-1",
            generated_fields=["holder"],
        )

    first = await acquire("token-1", 30)
    retried = await acquire("token-2", 30)
    other = await api.http.post(
        lock_url(lock, "acquire"),
        json={"holder": "token-1", "ttl_s": 60},
        headers={"Idempotency-Key": "effect-1"},
    )

    assert first.version == retried.version == 1 and retried.duplicate
    assert_problem(other, 409, "/problems/idempotency-conflict")


async def test_ids_remembered_without_a_hash_are_taken_as_the_same_command(api: Api) -> None:
    # A run continued from an older one: its carry remembers the id but not the command.
    lock = f"lock-{uuid.uuid4().hex[:6]}"
    carry = AggregateCarry(
        state={"holder": "h1", "until": "2100-01-01T00:00:00Z"},
        version=1,
        views={"holders": ["h1"]},
        seen_commands={"old-key": 1},
    )
    await api.stack.client.start_workflow(
        WORKFLOW_TYPE,
        AggregateInput(type="lock", id=lock, carry=carry),
        id=aggregate_workflow_id("lock", lock),
        task_queue=api.stack.task_queue,
    )

    repeat = await api.http.post(
        lock_url(lock, "release"), json={"holder": "h1"}, headers={"Idempotency-Key": "old-key"}
    )
    released = await api.http.post(
        lock_url(lock, "release"), json={"holder": "h1"}, headers={"Idempotency-Key": "new-key"}
    )
    again = await api.http.post(
        lock_url(lock, "acquire"),
        json={"holder": "h2", "ttl_s": 30},
        headers={"Idempotency-Key": "new-key"},
    )

    assert repeat.status_code == 200 and repeat.json() == {
        "events": [],
        "version": 1,
        "duplicate": True,
    }
    assert released.status_code == 200 and released.json()["version"] == 2
    # An id remembered from now on has its hash.
    assert_problem(again, 409, "/problems/idempotency-conflict")
