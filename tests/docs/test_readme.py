"""The README is the front door: short, holding no table the docs hold, and every end state of
an item named where it says how an item ends."""

from __future__ import annotations

from configuration.settings import PROJECT_ROOT

README = (PROJECT_ROOT / "README.md").read_text()


def test_the_readme_is_at_most_200_lines() -> None:
    assert len(README.splitlines()) <= 200


def test_the_readme_holds_no_table() -> None:
    assert not [line for line in README.splitlines() if line.startswith("|---")]


def test_the_readme_names_every_way_an_item_ends() -> None:
    intro = README.split("## ")[0]
    for status in ("`sent`", "`failed`", "`cancelled`", "`superseded`"):
        assert status in intro
