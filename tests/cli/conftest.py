"""The CLI tests drive the API on a real loopback port."""

from tests.api.conftest import served_api_factory  # noqa: F401
