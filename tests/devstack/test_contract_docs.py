"""The README's table of signals, updates and queries is generated, and kept current by this."""

from __future__ import annotations

from devstack.contract_docs import BEGIN, END, README, contract_table, main, readme_with_table


def test_readme_table_is_current() -> None:
    assert main(["--check"]) == 0, "run: python -m devstack.contract_docs"


def test_table_names_every_handler_with_its_payload_fields() -> None:
    table = contract_table()

    for handler in ("`status` | query", "`cancel` | update", "`request_cancel` | signal"):
        assert handler in table
    assert '"reason": string = "cancelled by request"' in table
    assert (
        "temporal workflow signal --workflow-id 'outbox/demo/invoice-7' --name request_cancel"
        in table
    )


def test_a_stale_table_is_replaced() -> None:
    stale = f"intro\n{BEGIN}\n| old table |\n{END}\noutro\n"

    updated = readme_with_table(stale)

    assert "| old table |" not in updated and contract_table() in updated
    assert updated.startswith("intro\n") and updated.endswith("outro\n")
    assert README.exists()
