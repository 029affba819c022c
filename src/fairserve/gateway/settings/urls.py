"""URLs as the gateway shows them: credentials hidden (`redact`, `redact_text`), and the checks of the URLs and
proxy addresses a config names."""

from __future__ import annotations

import functools
import ipaddress
import re
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

# NOTE: query parameters that carry a secret (the Redis client takes `?password=`): their values are never shown
_SECRET_PARAM = re.compile(r"(?i)([?&;](?:password|passwd|pass|pwd|secret|token|api_key|apikey|key|auth)=)[^&;#\s]*")


@functools.lru_cache(maxsize=1024)  # NOTE: a backend's name, read at each dispatch
def redact(url: str) -> str:
    """`url` as it may be shown, logged or used as a label: any `user:password@` replaced by `***@`, the value of a
    query parameter that may hold a secret (`?password=...`) by `***`. A malformed URL (`redis:/:pw@host`) is masked
    from its scheme to its last `@`."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<invalid URL>"
    if "@" in parts.netloc:
        url = urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))
    elif "@" in url:  # NOTE: not a URL urlsplit understands: whatever precedes an @ may be a credential
        head, _, tail = url.rpartition("@")
        scheme, sep, _ = head.partition(":")
        url = (scheme + sep if sep and scheme.isalnum() else "") + "***@" + tail
    return _SECRET_PARAM.sub(r"\1***", url)


_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*:(?://)?)[^\s@'\"]*@")


def redact_text(text: str) -> str:
    """`text` (an error message, a log line) with the credentials of every URL in it replaced by `***`, malformed
    URLs and secret query parameters included."""
    return _SECRET_PARAM.sub(r"\1***", _USERINFO.sub(r"\1***@", text))


HTTP_URL = re.compile(r"^https?://[^/\s]+")
REDIS_URL = re.compile(r"^(redis|rediss|unix)://\S+$")


def checked_url(v: str, pattern: re.Pattern[str], what: str) -> str:
    """`v` stripped, if it matches `pattern`; else ValueError naming `what` was expected (credentials hidden)."""
    v = v.strip()
    if not pattern.match(v):
        raise ValueError(f"must be {what}, got {redact(v)!r}")
    return v


def has_credentials(url: str) -> bool:
    return "@" in urlsplit(url).netloc


def check_proxy(entry: str) -> None:
    """ValueError unless `entry` is an IP address or a network (CIDR, host bits zero) as uvicorn reads them: it takes
    anything else for a name that never matches."""
    try:
        ipaddress.ip_network(entry) if "/" in entry else ipaddress.ip_address(entry)
    except ValueError:
        raise ValueError(
            f'each entry must be an IP address or a network like 10.0.0.0/8 (or the list be ["*"]), got {entry!r}'
        ) from None


def check_tls(certfile: str | None, keyfile: str | None) -> None:
    """ValueError for a key without its certificate, or a file that is not there."""
    if keyfile is not None and certfile is None:
        raise ValueError("ssl_keyfile: needs ssl_certfile (the certificate) too")
    for name, path in (("ssl_certfile", certfile), ("ssl_keyfile", keyfile)):
        if path is not None and not Path(path).is_file():
            raise ValueError(f"{name}: no such file: {path}")
