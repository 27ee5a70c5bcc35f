"""The dev-server launcher that `make dev` uses: search attributes, persistence, clean stop."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import pytest
from durable_outbox_temporal.contract.search_attributes import ALL, OUTBOX_NAME
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from devstack.temporal_server import DevServer, port_in_use
from tests.ports import free_port


@pytest.mark.timeout(60)
async def test_search_attributes_and_workflows_survive_a_restart(tmp_path: Path) -> None:
    db_file = tmp_path / "temporal.db"
    port, ui_port = free_port(), free_port()
    workflow_id = f"persisted-{uuid.uuid4()}"

    async with DevServer(db_file, port=port, ui_port=ui_port) as server:
        client = await Client.connect(server.address)
        listed = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace="default")
        )
        for key in ALL:
            assert listed.custom_attributes[key.name] == IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
        # No worker polls this queue: the workflow stays running, only the server holds it.
        await client.start_workflow(
            "NoWorkerWorkflow",
            id=workflow_id,
            task_queue=f"nobody-{uuid.uuid4()}",
            search_attributes=TypedSearchAttributes(
                [SearchAttributePair(OUTBOX_NAME, "persisted")]
            ),
        )
    assert server.process is not None and server.process.returncode is not None
    assert not port_in_use(port)
    assert db_file.exists()

    async with DevServer(db_file, port=port, ui_port=ui_port) as server:
        client = await Client.connect(server.address)
        description = await client.get_workflow_handle(workflow_id).describe()
        assert description.status == WorkflowExecutionStatus.RUNNING
        assert description.typed_search_attributes.get(OUTBOX_NAME) == "persisted"


async def test_a_taken_port_fails_fast_instead_of_reaching_the_other_server(
    tmp_path: Path,
) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = int(listener.getsockname()[1])
        server = DevServer(tmp_path / "temporal.db", port=taken, ui_port=free_port())
        with pytest.raises(RuntimeError, match=f"port {taken} is already in use"):
            async with server:
                pass
    assert server.process is None
