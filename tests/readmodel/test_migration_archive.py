"""Migrations are history: every landed migration is sealed in its folder's `SHA256SUMS` and
never edited afterwards (a database that ran it would never run the edit). A fix is a new
revision; `python -m devstack.archive seal` seals a new one as it lands."""

from __future__ import annotations

from pathlib import Path

import pytest

from devstack.archive import check, read_manifest
from readmodel.db import MIGRATIONS_DIR
from tests.conftest import SEED_TYPES

# Each folder whose migrations are sealed, with the files that are migrations in it.
FOLDERS = [(MIGRATIONS_DIR, "versions/*.py")] + [
    (folder, "*.py") for folder in SEED_TYPES.migrations
]


@pytest.mark.parametrize("folder, pattern", FOLDERS, ids=[str(f.name) for f, _ in FOLDERS])
def test_every_landed_migration_is_sealed_and_unchanged(folder: Path, pattern: str) -> None:
    drift = check(folder)
    assert not drift, f"a released migration changed or went: write a new revision\n{drift}"
    on_disk = {
        path.relative_to(folder).as_posix()
        for path in folder.glob(pattern)
        if path.name != "__init__.py"
    }
    unsealed = sorted(on_disk - set(read_manifest(folder)))
    assert not unsealed, (
        f"seal new migrations as they land: python -m devstack.archive seal {folder}"
        f" --glob '{pattern}' ({', '.join(unsealed)})"
    )


def test_the_previous_releases_migrations_are_among_the_sealed() -> None:
    sealed = read_manifest(MIGRATIONS_DIR)
    assert {
        f"versions/{name}" for name in ("0001_initial.py", "0017_destination_activity.py")
    } <= set(sealed)
