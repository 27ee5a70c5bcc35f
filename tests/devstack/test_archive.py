"""The sealed archive's manifest: what it finds when a sealed file changes or goes."""

from __future__ import annotations

from pathlib import Path

import pytest

from devstack.archive import MANIFEST, check, main, read_manifest, seal


def _folder(tmp_path: Path) -> Path:
    (tmp_path / "a.json").write_text("a")
    (tmp_path / "b.json").write_text("b")
    assert seal(tmp_path) == ["a.json", "b.json"]
    return tmp_path


def test_a_sealed_folder_checks_clean(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    assert not check(folder)
    assert set(read_manifest(folder)) == {"a.json", "b.json"}
    assert main(["check", str(folder)]) == 0


def test_a_changed_or_deleted_file_is_drift(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    (folder / "a.json").write_text("a, re-recorded")
    (folder / "b.json").unlink()
    drift = check(folder)
    assert drift.changed == ["a.json"] and drift.missing == ["b.json"]
    assert main(["check", str(folder)]) == 1


def test_sealing_adds_new_files_and_never_reseals_a_drifted_one(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    before = (folder / MANIFEST).read_text()
    (folder / "c.json").write_text("c")
    assert seal(folder) == ["c.json"]
    assert (folder / MANIFEST).read_text().startswith(before)
    (folder / "a.json").write_text("changed")
    with pytest.raises(ValueError, match="drifted"):
        seal(folder)
