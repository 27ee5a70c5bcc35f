"""The contract page's table of signals, updates and queries is generated from the workflows'
definitions, and the committed page is kept current by this."""

from __future__ import annotations

import pytest
from temporalio.workflow import _Definition

from devstack.contract_docs import _WORKFLOWS, contract_page, contract_table
from devstack.reference_docs import COMMAND, REFERENCE_DIR


def test_the_contract_page_is_current() -> None:
    committed = (REFERENCE_DIR / "contract.md").read_text()

    assert committed == contract_page(), f"docs/reference/contract.md is stale: run {COMMAND}"


def test_table_names_every_handler_with_its_payload_fields() -> None:
    table = contract_table()

    for handler in ("`status` | query", "`cancel` | update", "`request_cancel` | signal"):
        assert handler in table
    assert '"reason": string = "cancelled by request"' in table
    assert (
        "temporal workflow signal --workflow-id 'outbox/demo/invoice-7' --name request_cancel"
        in table
    )


@pytest.mark.parametrize("workflow", _WORKFLOWS, ids=lambda workflow: workflow.cls.__name__)
def test_every_handler_of_each_workflow_has_a_row(workflow) -> None:
    definition = _Definition.must_from_class(workflow.cls)
    page = contract_page()

    handlers = {
        **{str(name): "query" for name in definition.queries},
        **{str(name): "update" for name in definition.updates},
        **{str(name): "signal" for name in definition.signals},
    }

    assert handlers
    assert page.startswith("# The Temporal contract\n")
    for name, kind in handlers.items():
        assert f"| `{name}` | {kind} |" in page
