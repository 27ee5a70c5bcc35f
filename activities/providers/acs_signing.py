"""ACS's HMAC-SHA256 request signing, shared by every ACS provider (email, SMS).

The scheme is the one the official SDKs use, so the real service, the SDKs' peers and our fake
provider all accept the requests.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from email.utils import formatdate
from urllib.parse import urlsplit

import httpx


def sign_request(request: httpx.Request, access_key: str) -> None:
    """Add ACS HMAC-SHA256 headers: the signature covers verb, path+query, date, host, body hash."""
    url = urlsplit(str(request.url))
    path_and_query = url.path + (f"?{url.query}" if url.query else "")
    date = formatdate(usegmt=True)
    content_hash = base64.b64encode(hashlib.sha256(request.content).digest()).decode()
    string_to_sign = f"{request.method}\n{path_and_query}\n{date};{url.netloc};{content_hash}"
    signature = base64.b64encode(
        hmac.new(base64.b64decode(access_key), string_to_sign.encode(), hashlib.sha256).digest()
    ).decode()
    request.headers["x-ms-date"] = date
    request.headers["x-ms-content-sha256"] = content_hash
    request.headers["Authorization"] = (
        f"HMAC-SHA256 SignedHeaders=x-ms-date;host;x-ms-content-sha256&Signature={signature}"
    )
