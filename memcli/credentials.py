"""Secrets inside URLs (a database URL's password, an LLM endpoint's `http://user:KEY@host/v1`
or `?api_key=...`): masked wherever a URL is shown (`redact_url`, `redact_text`), removed
wherever one is stored (`strip_credentials`, `without_credentials`). The secret itself stays
where the user put it (the config file, MEMCLI_* or the provider's environment variables) and is
read from there at run time."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote, urlsplit

#: What masked parts read as.
MASK = "***"
#: Words of a query parameter's name that make its value a secret (`api_key`, `apiKey`,
#: `access_token`, `auth`, `X-Amz-Signature`, ...), and the ends of a name written as one word
#: (`apikey`, `accesstoken`).
_SECRET_WORDS = frozenset(
    "password passwd pwd passphrase key apikey token secret sig signature auth"
    " authorization credential credentials".split()
)
_SECRET_ENDS = ("password", "passwd", "pwd", "key", "token", "secret", "sig", "signature")
#: URL schemes whose user name is an account (a database role), not a secret: shown.
_ACCOUNT_SCHEMES = ("postgresql", "postgres")
#: A URL inside free text (an error message): its user part (a password may hold any character
#: but a space), then up to a space, a quote or an angle bracket; trailing punctuation is
#: trimmed (`_trim`).
_CLOSING = {")": "(", "]": "[", "}": "{"}
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://(?:\S*@)?[^\s'\"<>]+")


def _is_secret(name: str) -> bool:
    name = unquote(name)
    words = re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+", name)
    return name.lower().replace("-", "_").endswith(_SECRET_ENDS) or any(
        w.lower() in _SECRET_WORDS for w in words
    )


def _split_user(rest: str) -> tuple[str | None, str]:
    """`rest` (a URL after its `scheme://`) as its user part (None: it has none) and the rest.
    A password may hold `/`, `?`, `#` and `@` unencoded, and a query `@`: of the `@`s after a
    user name without `/`, `?`, `#` and before a host without `@`, the first after a password
    without `/`, `?`, `#` ends the user part, else the last."""
    found = []
    for at, char in enumerate(rest):
        if char != "@":
            continue
        name, _, password = rest[:at].partition(":")
        host = re.split(r"[/?#]", rest[at + 1 :], maxsplit=1)[0]
        if any(c in name for c in "/?#") or "@" in host:
            continue
        if not any(c in password for c in "/?#"):
            return rest[:at], rest[at + 1 :]
        found.append(at)
    if not found:
        return None, rest
    return rest[: found[-1]], rest[found[-1] + 1 :]


def _user_shown(scheme: str, user: str, mask: str | None) -> str | None:
    """The user part as shown (`mask`) or stored (None), itself None when it goes entirely: a
    password is masked; a user name without one is a key (`https://sk-...@host`) but in a
    database URL (a role, whose password is elsewhere)."""
    name, colon, password = user.partition(":")
    if password:  # (an empty one, `postgres:@`, is no secret: shown as it is)
        return f"{name}:{mask}" if mask is not None else name
    if scheme.lower() in _ACCOUNT_SCHEMES or not name:
        return user
    return None if mask is None else mask + colon


def _params(text: str, mask: str | None) -> str:
    """A query (or fragment) with each secret parameter's value as `mask` (None: removed);
    everything else as it was."""
    kept = []
    for pair in text.split("&"):
        name, eq, _ = pair.partition("=")
        if eq and _is_secret(name):
            if mask is not None:
                kept.append(f"{name}={mask}")
        else:
            kept.append(pair)
    return "&".join(kept)


def _rewrite(url: str, mask: str | None) -> str:
    """`url` with its credentials (a password, a key as user name, secret query and fragment
    parameters) replaced by `mask` (None: removed)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    user, rest = _split_user(rest)
    urlsplit(f"{scheme}://{rest}")  # (ValueError for a URL Python cannot read)
    rest, hash_, fragment = rest.partition("#")
    rest, question, query = rest.partition("?")
    shown = None if user is None else _user_shown(scheme, user, mask)
    url = f"{scheme}://{'' if shown is None else shown + '@'}{rest}"
    for sep, part in ((question, query), (hash_, fragment)):
        kept = _params(part, mask)
        if sep and (kept or not part):  # (a query left empty goes, with its `?`)
            url += sep + kept
    return url


def _trim(url: str) -> tuple[str, str]:
    """A URL found in text, and the punctuation after it that is the text's (a final stop, a
    closing bracket without its opening one)."""
    end = len(url)
    while end:
        c = url[end - 1]
        opening = _CLOSING.get(c)
        if c in ".,;:!?" or (opening and url.count(c, 0, end) > url.count(opening, 0, end)):
            end -= 1
        else:
            break
    return url[:end], url[end:]


def _in_text(text: str, mask: str | None) -> str:
    """`text` with every URL in it rewritten (`_rewrite`)."""

    def rewritten(match: re.Match[str]) -> str:
        url, tail = _trim(match.group(0))
        return (redact_url(url) if mask is not None else strip_credentials(url)) + tail

    return _URL.sub(rewritten, text)


def redact_url(url: str) -> str:
    """A URL as messages show it: a password, a key given as user name, and the value of
    every secret query or fragment parameter (`api_key`, `access_token`, `auth`, ...) as ***."""
    try:
        return _rewrite(url, MASK)
    except ValueError:
        return url.split("://", 1)[0] + "://..."


def strip_credentials(url: str) -> str:
    """A URL as it may be stored: without its password, a key given as user name, and its
    secret query and fragment parameters (a database role stays, and the user name before a
    password, so that the configured URL it came from can be recognised: `same_endpoint`)."""
    try:
        return _rewrite(url, None)
    except ValueError:
        return url.split("://", 1)[0] + "://..."


def redact_text(text: str) -> str:
    """Free text (an error message, a library's exception) with every URL in it redacted."""
    return _in_text(text, MASK)


def url_secrets(url: str) -> list[str]:
    """The secrets a URL holds, as written and percent-decoded, longest first: its password (or a
    key given as user name), and the value of every secret query or fragment parameter. Read by
    memcli's own parser, so that a URL a library cannot parse (a space in the password, `%zz`)
    still has its secrets named, for `hide_secrets` to mask in that library's messages."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return []
    found: set[str] = set()
    user, rest = _split_user(rest)
    if user is not None:
        name, _, password = user.partition(":")
        if password:
            found.add(password)
        elif name and scheme.lower() not in _ACCOUNT_SCHEMES:
            found.add(name)
    for part in re.split(r"[?#&]", rest)[1:]:
        name, eq, value = part.partition("=")
        if eq and value and _is_secret(name):
            found.add(value)
    found |= {unquote(s) for s in found}
    return sorted((s for s in found if s.strip()), key=len, reverse=True)


def hide_secrets(text: str, url: str) -> str:
    """`text` (a library's error about `url`) with every secret of the URL in it, as written or
    decoded, as ***, and every URL in it redacted."""
    for secret in url_secrets(url):
        text = text.replace(secret, MASK)
    return redact_text(text)


#: The keywords of a libpq connection string (`host=db dbname=memcli password=...`).
_LIBPQ_KEYWORDS = frozenset(
    "host hostaddr port dbname user password passfile sslmode sslcert sslkey sslrootcert"
    " connect_timeout options application_name service target_session_attrs".split()
)
_KEYWORD_PAIR = re.compile(r"\s*([A-Za-z_]+)\s*=\s*('(?:[^'\\]|\\.)*'|\S*)")


def libpq_keywords(text: str) -> dict[str, str] | None:
    """`text` read as a libpq keyword/value connection string (`host=db dbname=memcli`): its
    pairs, or None when it is not one (every word a `keyword=value` pair, one of them a libpq
    keyword, and no `/` before the first `=`: a file path such as `./a=b.db` is not one)."""
    if "=" not in text or "/" in text.split("=", 1)[0] or "://" in text:
        return None
    pairs: dict[str, str] = {}
    at = 0
    while at < len(text):
        if text[at:].strip() == "":
            break
        match = _KEYWORD_PAIR.match(text, at)
        if match is None or match.end() == at:
            return None
        pairs[match.group(1).lower()] = match.group(2)
        at = match.end()
    return pairs if pairs.keys() & _LIBPQ_KEYWORDS else None


def redact_keywords(pairs: dict[str, str]) -> str:
    """A libpq keyword string as messages show it: its password's value as ***."""
    return " ".join(f"{k}={MASK if k == 'password' else v}" for k, v in pairs.items())


def without_credentials(value: Any) -> Any:
    """A stored definition (a `[[blocks]]` table, nested tables and lists too) with every URL
    in its strings stripped of its credentials."""
    if isinstance(value, str):
        return _in_text(value, None) if "://" in value else value
    if isinstance(value, dict):
        return {k: without_credentials(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [without_credentials(v) for v in value]
    return value


def same_endpoint(stored: str, configured: str | None) -> bool:
    """Whether a stored (stripped) URL is the configured one, whose credentials it then takes."""
    return configured is not None and strip_credentials(configured) == stored
