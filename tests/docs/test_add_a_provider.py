"""`docs/how-to/add-a-provider.md` names every member the `Provider` protocol asks for and its
example defines it, so a member added to the protocol (as `probe()` was) cannot be missing from
the guide."""

from __future__ import annotations

from activities.providers.base import Provider
from configuration.settings import PROJECT_ROOT

PAGE = PROJECT_ROOT / "docs" / "how-to" / "add-a-provider.md"


def protocol_members() -> dict[str, str]:
    """Each member, and how the guide's example must declare it."""
    members = {name: f"{name}: ClassVar" for name in Provider.__annotations__}
    members.update(
        {name: f"async def {name}(" for name in vars(Provider) if not name.startswith("_")}
    )
    return members


def test_the_guide_names_and_shows_every_member_of_the_provider_protocol() -> None:
    text = PAGE.read_text()
    members = protocol_members()

    assert set(members) == {"kind", "submit", "poll", "probe"}  # what the guide was checked for
    missing = [name for name, declared in members.items() if f"`{name}" not in text]
    undeclared = [name for name, declared in members.items() if declared not in text]
    assert (missing, undeclared) == ([], [])
