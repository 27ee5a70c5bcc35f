"""Secrets kept out of log lines: a credential in a URL's query (`?token=`, `&secret=`) is
written as `***`. The API installs it (uvicorn's access log prints request lines), and so does
the worker (a provider's error may quote its URL)."""

from __future__ import annotations

import logging
import re

# A credential in a URL's query (`?token=`, `&secret=`), as access logs print request lines.
_SECRET_IN_QUERY = re.compile(r"(?i)([?&](?:token|secret|access_token|api_key)=)[^&\s\"']*")


class RedactSecrets(logging.Filter):
    """Rewrites `token=` and `secret=` query values to `***` in a record's message and its
    arguments (uvicorn's access log formats the request line from them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            # Not only strings: httpx logs its request line with an `httpx.URL` argument.
            record.args = tuple(_redacted_arg(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: _redacted_arg(v) for k, v in record.args.items()}
        return True


def _redacted_arg(arg: object) -> object:
    if isinstance(arg, str):
        return redact(arg)
    if isinstance(arg, (int, float, bool)) or arg is None:
        return arg
    text = str(arg)
    redacted = redact(text)
    return arg if redacted == text else redacted


def redact(text: str) -> str:
    """`text` with every query credential's value replaced by `***`."""
    return _SECRET_IN_QUERY.sub(r"\1***", text)


def install_log_redaction() -> None:
    """The filter on uvicorn's loggers (its access log propagates nowhere), on httpx's (its
    request lines quote the URL, query and all) and on every handler of the root logger, which
    every other logger's records reach."""
    loggers = [
        logging.getLogger(name) for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "httpx")
    ]
    root = logging.getLogger()
    for target in [*loggers, *root.handlers, *(h for lg in loggers for h in lg.handlers)]:
        if not any(isinstance(f, RedactSecrets) for f in target.filters):
            target.addFilter(RedactSecrets())
