"""Archives that only grow: a folder of released files sealed by a `SHA256SUMS` manifest.

The replay histories of each release (`tests/histories/<version>/`) and the released migrations
(`readmodel/migrations/`, `examples/labour/migrations/`) are sealed this way; the tests hold every
sealed file to its digest, so a released file is never edited, re-recorded or deleted. A release
adds files and lines, it never changes an old one.

    python -m devstack.archive seal tests/histories/0.2.0          # write a new folder's manifest
    python -m devstack.archive seal readmodel/migrations --glob 'versions/*.py'  # add new lines
    python -m devstack.archive check tests/histories/0.1.0         # exit 1 on any drift

The manifest is `sha256sum`'s format, so `sha256sum -c SHA256SUMS` checks it too.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "SHA256SUMS"


def digest(path: Path) -> str:
    """The sha256 of a file's bytes, in hex."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_manifest(folder: Path) -> dict[str, str]:
    """The sealed files of `folder`, path (relative to it) -> sha256; empty when unsealed."""
    manifest = folder / MANIFEST
    if not manifest.exists():
        return {}
    sealed: dict[str, str] = {}
    for line in manifest.read_text().splitlines():
        if line.strip():
            sha, _, name = line.partition("  ")
            sealed[name] = sha
    return sealed


@dataclass(frozen=True)
class Drift:
    """What no longer matches a sealed manifest."""

    changed: list[str]
    missing: list[str]

    def __bool__(self) -> bool:
        return bool(self.changed or self.missing)

    def __str__(self) -> str:
        lines = [f"changed since sealed: {name}" for name in self.changed]
        lines += [f"sealed but gone: {name}" for name in self.missing]
        return "\n".join(lines)


def check(folder: Path) -> Drift:
    """Every file the manifest of `folder` seals, still there with the same bytes."""
    changed: list[str] = []
    missing: list[str] = []
    for name, sha in sorted(read_manifest(folder).items()):
        path = folder / name
        if not path.is_file():
            missing.append(name)
        elif digest(path) != sha:
            changed.append(name)
    return Drift(changed, missing)


def seal(folder: Path, pattern: str = "*.json") -> list[str]:
    """Add the files of `folder` matching `pattern` that are not sealed yet to its manifest;
    returns the names added. Refuses while a sealed file has drifted: sealing never re-seals."""
    drift = check(folder)
    if drift:
        raise ValueError(f"{folder} has drifted from its manifest:\n{drift}")
    sealed = read_manifest(folder)
    added = sorted(
        name
        for name in (path.relative_to(folder).as_posix() for path in folder.glob(pattern))
        if name not in sealed and name != MANIFEST
    )
    with (folder / MANIFEST).open("a") as manifest:
        for name in added:
            manifest.write(f"{digest(folder / name)}  {name}\n")
    return added


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.archive", description=__doc__)
    parser.add_argument("action", choices=["seal", "check"])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--glob", default="*.json", help="the files `seal` adds (default *.json)")
    args = parser.parse_args(argv)
    if args.action == "seal":
        for name in seal(args.folder, args.glob):
            print(f"sealed {name}")
        return 0
    drift = check(args.folder)
    if drift:
        print(drift, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
