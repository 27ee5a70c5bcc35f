"""One TLS context per process for the many short-lived HTTP clients of the CLI, the dev tools
and the tests.

httpx builds a TLS context for every client it makes, loading certifi's CA bundle each time
(about 25 ms of CPU), even for a client that only ever calls a loopback `http://` URL. The fake
provider's admin makes a client per call, the CLI one per command (the tests run hundreds in one
process), and the test suite one per stack: profiles of the whole suite found 97 s of its CPU in
those loads (2026-11-28), and 11 s more in the CLI's (2026-11-29). A context is safe to share
between clients; this one is built once, as httpx would build it (`SSL_CERT_FILE` and
`SSL_CERT_DIR` honoured).
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def shared_tls_context() -> ssl.SSLContext:
    """httpx's default TLS context, built once for this process."""
    return httpx.create_ssl_context()
