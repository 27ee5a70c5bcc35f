"""One TLS context per process for the many short-lived HTTP clients of the CLI, the dev tools
and the tests.

httpx builds a TLS context for every client it makes, loading certifi's CA bundle each time,
even for a client that only ever calls a loopback `http://` URL. The fake provider's admin makes
a client per call, the CLI one per command (the tests run hundreds in one process), and the test
suite one per stack: the suite's profiles found those loads among its largest costs
(docs/decisions/parallel-tests.md). A context is safe to share between clients; this one is
built once, as httpx would build it (`SSL_CERT_FILE` and `SSL_CERT_DIR` honoured).
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def shared_tls_context() -> ssl.SSLContext:
    """httpx's default TLS context, built once for this process."""
    return httpx.create_ssl_context()
