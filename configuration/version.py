"""The release this checkout is: the one place its version is written.

`pyproject.toml` reads it (`[tool.setuptools.dynamic]`); `outbox --version`, `/healthz` and the
dashboard show it; the two client packages version in step (`tests/test_release.py` holds them to
it). Semantic versioning: CHANGELOG.md lists what each release changed.
"""

VERSION = "0.2.0"
