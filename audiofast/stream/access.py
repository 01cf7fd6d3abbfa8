"""Who may talk to ``audiofast serve``: the bind address, the bearer token, the Origin header.

A browser lets any web page open a WebSocket to 127.0.0.1 and sends the page's origin along;
without an Origin check, every site the user visits could stream to (and read from) a local
server. Clients that are not browsers send no Origin and are allowed.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from websockets.datastructures import Headers

TOKEN_ENV = "AUDIOFAST_TOKEN"


def is_loopback(host: str | None) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse to expose an unauthenticated server beyond this machine."""
    if not token and not is_loopback(host):
        raise ValueError(f"refusing to listen on {host} without --token (no token: loopback only)")


def resolve_token(token: str | None, token_file: str | None,
                  environ: Mapping[str, str] = os.environ) -> str | None:
    """``--token``, else ``--token-file``, else ``$AUDIOFAST_TOKEN``: the last two keep the
    secret out of ``ps`` and shell history."""
    if token and token_file:
        raise ValueError("give --token or --token-file, not both")
    if token_file:
        try:
            value = Path(token_file).read_text().strip()
        except OSError as e:
            raise ValueError(f"cannot read --token-file {token_file}: {e.strerror}") from None
        if not value:
            raise ValueError(f"--token-file {token_file} is empty")
        return value
    return token or environ.get(TOKEN_ENV, "").strip() or None


def origin_allowed(headers: Headers, allowed: Sequence[str], token: str | None) -> bool:
    """No Origin (not a browser), an origin listed in ``allowed`` ("*": any), or this server's
    own page. Without a token the page must also have come from a loopback name, so a site
    whose DNS name was rebound to 127.0.0.1 does not count as "our own page"."""
    origins = headers.get_all("Origin")
    if not origins:
        return True
    if len(origins) > 1:
        return False
    origin = origins[0]
    if "*" in allowed or origin in allowed:
        return True
    host = headers.get_all("Host")
    if len(host) != 1 or origin not in (f"http://{host[0]}", f"https://{host[0]}"):
        return False
    return bool(token) or is_loopback(urlsplit(origin).hostname)
