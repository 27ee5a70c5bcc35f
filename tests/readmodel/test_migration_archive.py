"""Migrations are history: every landed migration is sealed in its folder's `SHA256SUMS` and
never edited afterwards (a database that ran it would never run the edit). A fix is a new
revision; `python -m devstack.archive seal` seals a new one as it lands."""

from __future__ import annotations

from pathlib import Path

import pytest

import examples.labour
from devstack.archive import check, digest, read_manifest
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


# Every migration released so far (all of them in 0.2.0, sealed at commit 4c9d350) by its
# revision, with its SHA-256 written here rather than read from a manifest: a file edited
# together with its manifest line still fails. A release cut adds the migrations it ships.
RELEASED = {
    MIGRATIONS_DIR / "versions": {
        "0001": "592e8bcfb8d94ee6e1b518ae63a08cd8a48e3f196102aec4c72a41adc01238bb",
        "0002": "107245ab00b19b6c99e03df8e73de474df8e239b7d4fce1789dfc33cc9118247",
        "0003": "d543a3401af4210bab5fb1e66ec9a678ec26e18b866cb2bedfe201cb26d54f6d",
        "0004": "2b2d37a10de2f213ecc05fd2b8bff4cf821e609376b777b18cc0e79c19ff6b83",
        "0005": "40142a4ff0421f561b92f70c7e7f0a3fb26b8a759502170d5b2b3694eb2a1a10",
        "0006": "19c748b6d1b2861ff5048864d6c808da56a44622dd0a6eb6497a57fb1c67f1ca",
        "0007": "c3097c5ee801ae0d3301085dd249adca804b84675d99d0dfc6c4447d2dc11935",
        "0008": "f606a474417482b6c8cdfda867974c23a63d3c36ceb36c3f6a67e4028491a048",
        "0009": "c41e3f90679cdbde2bc139a95dcb46fd10bd3acc4011e39d58db5cc9a4ad2985",
        "0010": "e784179010588c5a269c53167e16ec7c9dfcf10a756e375569bccee0f4f37f3d",
        "0011": "a53f7d05179ec4c8b1c2aed62e2796c28a4a86d9d0f114212c09165ffdfb6ab5",
        "0012": "9c78ccfea4f703448318e8c777f39b6538776e11062ca15c6e426147853a44db",
        "0013": "1a5f2318ae6429a865f1d12726d06c4ab5bffed41f0711d6c9d2b04b9fc34de8",
        "0014": "e8990de21ff8b4ec989ff05e92f569a298a16b74ba1aa879d23a44120e27fe7b",
        "0015": "cb7bffd375a89dc2ef60219bf486f3d5b0f95ffb6a929f1628f0bf5be3ef8b8e",
        "0016": "2b17fe3ce2820b7b79991534f0f7279c867d43af5e4ed32d1a2d063c2896138e",
        "0017": "10c26dcfdbae43906d9f207ec119af22c76e1a341f087c162b535616c5beb50d",
        "0018": "e104a17f2b1cccff4472ef3564a7253f052c2a150c5a37fd346cc4aab619fa6b",
        "0019": "d59a2a65c72a53f641837f30793f9170b1799ab2cb5db94966e11867cfe812f0",
        "0020": "d19a6851491db44b594ff97ecd5a3653e9f58f69f2fb5e666687dbe7f775ef85",
        "0021": "8688cf58240240511b822b3566b50d38fb184a9fb031b85c0022928ee87d7dd6",
    },
    Path(examples.labour.__file__).parent / "migrations": {
        "labour_0001": "fc542515db0904534720040cb742acb2a06699000f2e110c0e4146a731be4f34",
    },
}


@pytest.mark.parametrize("folder", RELEASED, ids=[folder.parent.name for folder in RELEASED])
def test_every_released_migration_keeps_its_pinned_digest(folder: Path) -> None:
    root = MIGRATIONS_DIR if folder.name == "versions" else folder
    sealed = read_manifest(root)
    for revision, sha in RELEASED[folder].items():
        [path] = folder.glob(f"{revision}_*.py")  # one file per revision, never deleted
        name = path.relative_to(root).as_posix()
        assert digest(path) == sha, f"released migration {name} was edited"
        assert sealed.get(name) == sha, f"the manifest's line for {name} was changed or removed"


def test_each_releases_head_is_among_the_pinned() -> None:
    assert {"0017", "0021"} <= set(RELEASED[MIGRATIONS_DIR / "versions"])  # 0.1.0's, 0.2.0's
