"""The replay archive only grows: every released folder of `tests/histories/` keeps each history
its manifest seals, byte for byte, and gains none; recordings go to the current release's folder
and never over an existing file."""

from __future__ import annotations

from pathlib import Path

import pytest

from configuration.version import VERSION
from devstack.archive import MANIFEST, check, read_manifest
from tests.conftest import HISTORIES_DIR, record_history_file

RELEASES = sorted(path for path in HISTORIES_DIR.iterdir() if path.is_dir())


def _semver(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split("."))


def test_each_folder_is_a_release_no_newer_than_this_one() -> None:
    assert RELEASES, "the archive has no release folder"
    assert not list(HISTORIES_DIR.glob("*.json")), "a history outside a release folder"
    for folder in RELEASES:
        assert _semver(folder.name) <= _semver(VERSION), folder.name


@pytest.mark.parametrize("folder", RELEASES, ids=[folder.name for folder in RELEASES])
def test_a_released_folder_keeps_every_sealed_history_unchanged(folder: Path) -> None:
    if folder.name != VERSION:
        assert (folder / MANIFEST).exists(), f"release {folder.name} was never sealed"
    drift = check(folder)
    assert not drift, f"{folder.name}: an archived history changed or disappeared\n{drift}"


@pytest.mark.parametrize(
    "folder",
    [folder for folder in RELEASES if folder.name != VERSION],
    ids=[folder.name for folder in RELEASES if folder.name != VERSION],
)
def test_an_older_release_gains_no_history(folder: Path) -> None:
    on_disk = {path.name for path in folder.glob("*.json")}
    assert on_disk == set(read_manifest(folder)), "record new histories in the current release"


def test_the_previous_release_is_archived_whole() -> None:
    assert len(read_manifest(HISTORIES_DIR / "0.1.0")) == 70


def test_a_recording_goes_to_this_release_and_never_over_an_archived_file(tmp_path: Path) -> None:
    archived = tmp_path / VERSION / "test_archived.json"
    archived.parent.mkdir()
    archived.write_text('{"events": []}')
    with pytest.raises(FileExistsError, match="never rewritten"):
        record_history_file("test_archived.json", '{"events": [1]}', archive=tmp_path)
    assert archived.read_text() == '{"events": []}'

    # A test that finishes several items keeps the last one it recorded in this run.
    path = record_history_file("test_x.json", '{"events": [1]}', archive=tmp_path)
    assert path == tmp_path / VERSION / "test_x.json"
    record_history_file("test_x.json", '{"events": [2]}', archive=tmp_path)
    assert path.read_text() == '{"events": [2]}'
