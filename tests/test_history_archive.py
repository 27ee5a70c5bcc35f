"""The replay archive only grows: a folder of `tests/histories/` sealed by a `SHA256SUMS` manifest
is a release's and closed (no history added, changed or removed), its manifest is the one pinned
here, and the code not yet released records into `unreleased/` alone (docs/how-to/upgrade.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from configuration.version import VERSION
from devstack.archive import MANIFEST, check, digest, read_manifest
from tests.conftest import HISTORIES_DIR, UNRELEASED_HISTORIES, record_history_file

# Each release's manifest, as sealed at its cut: its SHA-256 and how many histories it seals.
# A history deleted or re-recorded together with its manifest line still fails here. A release
# cut adds its line (docs/how-to/upgrade.md, "Cutting a release").
SEALED = {
    "0.1.0": ("6bada0c231fa6de76970b07a96b1989a8e33c55e052db07499ff106497a06e26", 70),
    "0.2.0": ("3a4dda8ca6632b16f56f45d0c4ceffd9521c9e1407f7c9147d63fc4920b2a16c", 174),
}
FOLDERS = sorted(path for path in HISTORIES_DIR.iterdir() if path.is_dir())
RELEASED = [folder for folder in FOLDERS if folder.name != UNRELEASED_HISTORIES]


def _semver(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split("."))


def _history(workflow_type: str) -> str:
    started = {"workflowExecutionStartedEventAttributes": {"workflowType": {"name": workflow_type}}}
    return json.dumps({"events": [started]})


def test_the_archive_holds_the_pinned_releases_and_the_unreleased_folder() -> None:
    assert not [path for path in HISTORIES_DIR.iterdir() if path.is_file()], "a stray file"
    assert {folder.name for folder in RELEASED} == set(SEALED), (
        "each release folder is pinned in SEALED (a new one at its cut), and none goes"
    )
    for folder in RELEASED:
        assert _semver(folder.name) <= _semver(VERSION), folder.name


@pytest.mark.parametrize("folder", RELEASED, ids=[folder.name for folder in RELEASED])
def test_a_released_folder_is_closed(folder: Path) -> None:
    pinned_digest, pinned_count = SEALED[folder.name]
    assert (folder / MANIFEST).exists(), f"release {folder.name} was never sealed"
    assert digest(folder / MANIFEST) == pinned_digest, f"{folder.name}'s manifest was rewritten"
    sealed = read_manifest(folder)
    assert len(sealed) == pinned_count
    drift = check(folder)
    assert not drift, f"{folder.name}: an archived history changed or disappeared\n{drift}"
    on_disk = {path.name for path in folder.iterdir()} - {MANIFEST}
    added = sorted(on_disk - set(sealed))
    assert not added, f"{folder.name} is closed: record into {UNRELEASED_HISTORIES}/ ({added})"


def test_the_unreleased_folder_is_never_sealed() -> None:
    folder = HISTORIES_DIR / UNRELEASED_HISTORIES
    assert not (folder / MANIFEST).exists(), "at a release cut the folder takes the version's name"
    assert all(path.suffix == ".json" for path in folder.glob("*")), "only histories"


def test_a_recording_goes_to_the_unreleased_folder_and_never_into_a_sealed_one(
    tmp_path: Path,
) -> None:
    path = record_history_file("test_x.json", _history("OutboxItem"), archive=tmp_path)
    assert path == tmp_path / UNRELEASED_HISTORIES / "test_x.json"
    # Unreleased code runs nowhere: its histories are recorded again freely.
    record_history_file("test_x.json", _history("OutboxItem") + "\n", archive=tmp_path)
    assert path.read_text().endswith("\n")
    # One test's histories of two workflow types under one name: the second would hide the first.
    with pytest.raises(ValueError, match="suffix"):
        record_history_file("test_x.json", _history("ReplayBatch"), archive=tmp_path)

    (path.parent / MANIFEST).write_text(f"{digest(path)}  {path.name}\n")
    with pytest.raises(PermissionError, match="sealed"):
        record_history_file("test_y.json", _history("OutboxItem"), archive=tmp_path)
    assert not (path.parent / "test_y.json").exists()
