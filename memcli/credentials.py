"""Secrets inside URLs (a database URL's password, an LLM endpoint's `http://user:KEY@host/v1`
or `?api_key=...`): masked wherever a URL is shown (`redact_url`, `redact_text`), removed
wherever one is stored (`strip_credentials`, `without_credentials`). The secret itself stays
where the user put it (the config file, MEMCLI_* or the provider's environment variables) and is
read from there at run time."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

#: What masked parts read as.
MASK = "***"
#: Query parameters that hold a secret, by the end of their name (any case).
_SECRET_PARAMS = ("password", "passwd", "pwd", "key", "token", "secret", "sig", "signature")
#: A URL inside free text (an error message): up to a space, a quote or a bracket.
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>()\[\]{}]+")


def _is_secret(name: str) -> bool:
    return name.lower().replace("-", "_").endswith(_SECRET_PARAMS)


def _rewrite(url: str, mask: str | None) -> str:
    """`url` with its password and secret query parameters replaced by `mask` (None: removed)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        user, host = netloc.rsplit("@", 1)
        if ":" in user:
            name, password = user.split(":", 1)
            if password:  # (an empty one, `postgres:@`, is no secret: shown as it is)
                netloc = (f"{name}:{mask}" if mask is not None else name) + "@" + host
    query = parts.query
    pairs = parse_qsl(query, keep_blank_values=True)
    if any(_is_secret(k) for k, _ in pairs):
        kept = [
            (k, mask if _is_secret(k) else v)
            for k, v in pairs
            if mask is not None or not _is_secret(k)
        ]
        query = urlencode(kept, safe="/*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_url(url: str) -> str:
    """A URL as messages show it: any password (in the user part or the query) and any secret
    query parameter (`api_key`, `token`, ...) as ***."""
    try:
        return _rewrite(url, MASK)
    except ValueError:
        return url.split("://", 1)[0] + "://..."


def strip_credentials(url: str) -> str:
    """A URL as it may be stored: without its password and secret query parameters (the user
    name stays, so that the configured URL it came from can be recognised: `same_endpoint`)."""
    try:
        return _rewrite(url, None)
    except ValueError:
        return url.split("://", 1)[0] + "://..."


def has_credentials(url: str) -> bool:
    """Whether the URL holds a secret that `strip_credentials` removes."""
    return strip_credentials(url) != url


def redact_text(text: str) -> str:
    """Free text (an error message, a library's exception) with every URL in it redacted."""
    return _URL.sub(lambda m: redact_url(m.group(0)), text)


def without_credentials(value: Any) -> Any:
    """A stored definition (a `[[blocks]]` table, nested tables and lists too) with every URL
    in its strings stripped of its credentials."""
    if isinstance(value, str):
        return _URL.sub(lambda m: strip_credentials(m.group(0)), value) if "://" in value else value
    if isinstance(value, dict):
        return {k: without_credentials(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [without_credentials(v) for v in value]
    return value


def same_endpoint(stored: str, configured: str | None) -> bool:
    """Whether a stored (stripped) URL is the configured one, whose credentials it then takes."""
    return configured is not None and strip_credentials(configured) == stored
