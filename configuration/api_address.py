"""Where the `outbox` CLI finds the API by default: `OUTBOX_API_URL`, else the address the running
dev stack (`make dev`) recorded in its data directory, else `make dev`'s own default port. A stack
started on other ports (`DEV_API_PORT`) is then found from any terminal."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from configuration.settings import PROJECT_ROOT

# In the dev stack's data directory while the stack is up: its API's base URL, one line.
API_URL_FILE = "api-url"
DEFAULT_DEV_API_PORT = "8000"


def dev_data_dir(environ: Mapping[str, str]) -> Path:
    """The dev stack's data directory: `DEV_DATA_DIR`, else `.data` in the checkout."""
    return Path(environ.get("DEV_DATA_DIR") or PROJECT_ROOT / ".data").resolve()


def dev_api_url(environ: Mapping[str, str]) -> str:
    """The API's URL on a dev stack configured by `environ` (`DEV_API_PORT`)."""
    return f"http://127.0.0.1:{environ.get('DEV_API_PORT') or DEFAULT_DEV_API_PORT}"


def default_api_url(environ: Mapping[str, str]) -> str:
    """`OUTBOX_API_URL`; else the URL a running dev stack recorded; else `dev_api_url`."""
    if environ.get("OUTBOX_API_URL"):
        return environ["OUTBOX_API_URL"]
    try:
        recorded = (dev_data_dir(environ) / API_URL_FILE).read_text().strip()
    except OSError:
        recorded = ""
    return recorded or dev_api_url(environ)
